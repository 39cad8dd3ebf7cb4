"""docs/fsdp-ddp.md, "DDP on a subgroup": world size 4 on gloo, two DDP replicas of two
ranks each (DistributedDataParallel(model, process_group=pg), pg = ranks {0, 1} or {2, 3}),
tests/distributed/test_ddp.py's small_model, one backward on each rank's own batch. Prints
the largest |gradient - plain DDP's| with cp.ddp.hook("none") given group=pg and without it
(which averages over all 4 ranks), and the largest |plain DDP gradient| for scale.

Run: PYTHONPATH=src python benchmarks/docs_figures_2026-12-07/claim5_ddp_subgroup.py
"""

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import commpress as cp
from commpress.cluster.local import run_distributed


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))


def gradients(rank, pg, hook_group):
    model = small_model()
    ddp = DistributedDataParallel(model, process_group=pg)
    if hook_group != "plain":
        ddp.register_comm_hook(*cp.ddp.hook("none", group=hook_group))
    generator = torch.Generator().manual_seed(rank)
    x, y = (
        torch.randn(16, 32, generator=generator),
        torch.randint(0, 10, (16,), generator=generator),
    )
    F.cross_entropy(ddp(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def compare(rank, world_size):
    warnings.filterwarnings("ignore", category=FutureWarning)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    pg = pairs[rank // 2]
    plain = gradients(rank, pg, "plain")
    with_group = gradients(rank, pg, pg)
    without = gradients(rank, pg, None)
    return (
        (with_group - plain).abs().max().item(),
        (without - plain).abs().max().item(),
        plain.abs().max().item(),
    )


def main():
    by_rank = run_distributed(compare, 4, timeout=300)
    print("world size 4, DDP on pairs {0, 1} and {2, 3}, hook 'none'; per rank:")
    for rank, (with_group, without, scale) in enumerate(by_rank):
        print(
            f"rank {rank}: largest |gradient - plain DDP's| with group=pg {with_group:.3g}, "
            f"without group= {without:.3g}; largest |plain DDP gradient| {scale:.3g}"
        )


if __name__ == "__main__":
    main()
