"""docs/fsdp-ddp.md, "When none gives plain FSDP2's bits": plain FSDP2 against
cp.fsdp.compress(model, None, "none@ring") at world size 3 on gloo, one backward of
Sequential(Linear(16, 64), GELU, Linear(64, 2)), each Linear its own FSDP module; the last
one's reduce-scatter gives each rank 65 elements (a row of 64 weights and one bias). Prints,
per seed, module and rank, the gradient elements that differ and by how many ulps.

Run: PYTHONPATH=src python benchmarks/docs_figures_2026-12-07/claim1_fsdp_linear_64_2.py
"""

import sys
import warnings

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

import commpress as cp
from commpress.cluster.local import run_distributed

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ulps import ulps  # noqa: E402


def gradients(rank, seed, compressed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 2))
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=cp.fsdp.cpu_mesh())
    if compressed:
        cp.fsdp.compress(model, None, "none@ring")
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(100 * seed + rank))
    model(x).square().mean().backward()
    return {n: p.grad.to_local().flatten() for n, p in model.named_parameters()}


def compare(rank, world_size, seeds):
    warnings.filterwarnings("ignore", category=FutureWarning)
    found = {}
    for seed in seeds:
        plain, ours = gradients(rank, seed, False), gradients(rank, seed, True)
        for module in ("0", "2"):
            a = torch.cat([plain[f"{module}.weight"], plain[f"{module}.bias"]])
            b = torch.cat([ours[f"{module}.weight"], ours[f"{module}.bias"]])
            differ = a != b
            found[seed, module] = (
                a.numel(),
                [(a[i].item(), b[i].item(), int(ulps(a, b)[i])) for i in differ.nonzero()[:, 0]],
            )
    return found


def main():
    seeds = range(20)
    by_rank = run_distributed(compare, 3, seeds, timeout=600)
    print("world size 3, seeds 0-19; elements per rank's share: Linear(16, 64) 374, 374, 340")
    print("(even shares: 374 a rank), Linear(64, 2) 65, 65, 0 (odd: 65 a rank, rank 2 all pad)")
    for module, name in (("0", "Linear(16, 64)"), ("2", "Linear(64, 2)")):
        total = 0
        for seed in seeds:
            for rank, found in enumerate(by_rank):
                differing = found[seed, module][1]
                total += len(differing)
                for a, b, u in differing:
                    print(f"seed {seed} {name} rank {rank}: {a:.9g} vs {b:.9g} ({u} ulp)")
        print(f"{name}: {total} differing gradient elements over {len(seeds)} seeds")


if __name__ == "__main__":
    main()
