"""docs/fsdp-ddp.md, "Plain DDP's bits": world size 3 on gloo.

1. A bucket as the DDP hook sums it (each rank's floats scaled by 1/3): gloo's all-reduce
   against commpress's all_reduce(codec="none", algorithm="ring"), buckets of 7, 33, 831,
   2,762, 2,826 and 4,000,000 random floats, seeds 0-2: elements that differ.
2. DDP itself: 4 SGD steps of tests/distributed/test_ddp.py's small_model (one bucket of
   2,762 floats) under cp.ddp.hook("none") against plain DDP, world sizes 3 and 4.

Run: PYTHONPATH=src python benchmarks/docs_figures_2026-12-07/claim4_ddp_cuts.py
"""

import sys
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.testing.training import sgd_steps

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ulps import ulps  # noqa: E402

SIZES = (7, 33, 831, 2762, 2826, 4_000_000)


def buckets(rank, world_size, seeds):
    found = {}
    for seed in seeds:
        for numel in SIZES:
            generator = torch.Generator().manual_seed(1000 * seed + rank)
            bucket = torch.randn(numel, generator=generator).mul_(1 / world_size)
            native, ring = bucket.clone(), bucket.clone()
            dist.all_reduce(native)
            cp.all_reduce(ring, codec="none", algorithm="ring")
            found[seed, numel] = (int((native != ring).sum()), int(ulps(native, ring).max()))
    return found


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))


def trained(rank, spec):
    model = small_model()
    ddp = DistributedDataParallel(model)
    if spec is not None:
        ddp.register_comm_hook(*cp.ddp.hook(spec))
    losses = sgd_steps(ddp, 4, rank, features=32, batch=16, seed_stride=100)
    return losses, [p.detach().clone() for p in model.parameters()]


def ddp_differences(rank, world_size):
    warnings.filterwarnings("ignore", category=FutureWarning)
    (plain_losses, plain), (losses, ours) = trained(rank, None), trained(rank, "none")
    return (
        sum(a != b for a, b in zip(losses, plain_losses, strict=True)),
        sum(int((p != q).sum()) for p, q in zip(ours, plain, strict=True)),
        max(int(ulps(p, q).max()) for p, q in zip(ours, plain, strict=True)),
    )


def main():
    seeds = range(3)
    by_rank = run_distributed(buckets, 3, seeds, timeout=600)
    print("world size 3, bucket scaled by 1/3, gloo all_reduce vs none@ring")
    for numel in SIZES:
        counts = [[found[seed, numel][0] for found in by_rank] for seed in seeds]
        worst = max(found[seed, numel][1] for found in by_rank for seed in seeds)
        print(
            f"{numel} floats: differing elements per seed, per rank {counts}; largest {worst} ulp"
        )
    print(f"DDP, small_model ({sum(p.numel() for p in small_model().parameters())} floats)")
    for world_size in (3, 4):
        results = run_distributed(ddp_differences, world_size, timeout=600)
        losses = [r[0] for r in results]
        params = [r[1] for r in results]
        worst = max(r[2] for r in results)
        print(
            f"world size {world_size}, 4 steps, hook 'none' vs plain DDP: losses that differ "
            f"per rank {losses}, parameter elements that differ per rank {params}, "
            f"largest {worst} ulp"
        )


if __name__ == "__main__":
    main()
