"""docs/fsdp-ddp.md, "When none gives plain FSDP2's bits": at world size 3 on gloo, 4 SGD
steps of the FSDP test model (tests/distributed/test_fsdp.py's small_model, shard, data and
train, copied here) under cp.fsdp.compress with lossless specs, against plain FSDP2: the
largest |difference| of the losses and of the parameters after the 4 steps.

Run: PYTHONPATH=src python benchmarks/docs_figures_2026-12-07/claim2_fsdp_other_orders.py
"""

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

import commpress as cp
from commpress.cluster.local import run_distributed

SPECS = {
    "none, none (@ring)": ("none", "none"),
    "none, none@alltoall": ("none", "none@alltoall"),
    "auto:max_rel_err=0, auto:max_rel_err=0@auto": (
        "auto:max_rel_err=0",
        "auto:max_rel_err=0@auto",
    ),
    "none@native, none@native": ("none@native", "none@native"),
}


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10)
    )


def trained(rank, spec, steps=4, lr=0.05):
    model = small_model()
    for layer in (model[0], model[2], model[4], model):
        fully_shard(layer, mesh=cp.fsdp.cpu_mesh())
    if spec is not None:
        cp.fsdp.compress(model, *spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        generator = torch.Generator().manual_seed(1000 * step + 10 * rank)
        x, y = (
            torch.randn(16, 32, generator=generator),
            torch.randint(0, 10, (16,), generator=generator),
        )
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    return losses, [p.full_tensor().detach().clone() for p in model.parameters()]


def compare(rank, world_size):
    warnings.filterwarnings("ignore", category=FutureWarning)
    plain_losses, plain_params = trained(rank, None)
    found = {}
    for name, spec in SPECS.items():
        losses, params = trained(rank, spec)
        found[name] = (
            max(abs(a - b) for a, b in zip(losses, plain_losses, strict=True)),
            max((p - q).abs().max().item() for p, q in zip(params, plain_params, strict=True)),
        )
    return found


def main():
    by_rank = run_distributed(compare, 3, timeout=600)
    print("world size 3, 4 steps; largest |difference| from plain FSDP2 (over ranks)")
    for name in SPECS:
        loss = max(found[name][0] for found in by_rank)
        params = max(found[name][1] for found in by_rank)
        print(f"{name}: losses {loss:.3g}, parameters {params:.3g}")


if __name__ == "__main__":
    main()
