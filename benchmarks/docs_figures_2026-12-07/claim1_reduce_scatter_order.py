"""docs/fsdp-ddp.md, "When none gives plain FSDP2's bits": gloo's reduce-scatter against
commpress's none@ring, float32, random inputs; each rank's share of 1..139 elements at world
size 3 (seeds 0-2), and 60 values (15 a rank) at world size 4 (seeds 0-9).

Run: PYTHONPATH=src python benchmarks/docs_figures_2026-12-07/claim1_reduce_scatter_order.py
"""

import sys

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ulps import ulps  # noqa: E402


def differences(rank, world_size, shares, seeds):
    """{(seed, share): (elements of this rank's share that differ, their largest ulps)}."""
    found = {}
    for seed in seeds:
        for share in shares:
            generator = torch.Generator().manual_seed(1000 * seed + 10 * share + rank)
            inp = torch.randn(share * world_size, generator=generator)
            native, ring = torch.empty(share), torch.empty(share)
            dist.reduce_scatter_tensor(native, inp)
            cp.reduce_scatter_tensor(ring, inp, codec="none", algorithm="ring")
            differ = native != ring
            found[seed, share] = (
                int(differ.sum()),
                int(ulps(native, ring)[differ].max()) if differ.any() else 0,
            )
    return found


def main():
    shares, seeds = range(1, 140), range(3)
    by_rank = run_distributed(differences, 3, shares, seeds, timeout=600)
    print("world size 3, float32, each rank's share 1..139, seeds 0-2")
    for seed in seeds:
        for parity, sizes in (("odd", shares[::2]), ("even", shares[1::2])):
            hit = [s for s in sizes if any(r[seed, s][0] for r in by_rank)]
            print(f"seed {seed}: {parity} shares with a difference: {len(hit)} of {len(sizes)}")
        for rank, found in enumerate(by_rank):
            counts = sorted({found[seed, s][0] for s in shares if found[seed, s][0]})
            worst = max(found[seed, s][1] for s in shares)
            print(f"  rank {rank}: differing elements per share {counts}, largest {worst} ulp")
    seeds4 = range(10)
    by_rank = run_distributed(differences, 4, [15], seeds4, timeout=600)
    print("world size 4, 60 values (15 a rank), seeds 0-9: differing elements per rank")
    for seed in seeds4:
        counts = [found[seed, 15][0] for found in by_rank]
        print(f"seed {seed}: {counts}, largest {max(f[seed, 15][1] for f in by_rank)} ulp")


if __name__ == "__main__":
    main()
