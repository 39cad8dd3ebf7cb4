"""docs/lowrank.md, "Checkpoints": tests/distributed/test_lowrank.py's
test_a_hooked_run_resumed_in_new_processes_is_the_uninterrupted_run (DDP with several
buckets, cp.lowrank.ddp_hook("acpsgd:rank=2,start_iter=1"), 3 steps, torch.save, 3 more
steps; resumed in new processes from the saved state), its functions copied here, run at
world size 3 instead of 2. Prints, per rank, the parameter elements that differ between
the uninterrupted and the resumed run after step 6, and their largest |difference|.

Run: PYTHONPATH=src python benchmarks/docs_figures_2026-12-07/claim7_lowrank_resume_ws3.py
"""

import sys
import tempfile
import warnings

import torch
from torch.nn.parallel import DistributedDataParallel

import commpress as cp
from commpress.cluster.local import run_distributed

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ulps import ulps  # noqa: E402


def hooked_acpsgd():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 10))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.002)  # several buckets
    state, hook = cp.lowrank.ddp_hook("acpsgd:rank=2,start_iter=1", model=model)
    ddp.register_comm_hook(state, hook)
    return ddp, state


def sgd_steps(ddp, rank, steps):
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in steps:
        generator = torch.Generator().manual_seed(10 * step + rank)
        x = torch.randn(8, 32, generator=generator)
        y = torch.randint(0, 10, (8,), generator=generator)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def saved_midway(rank, world_size, directory):
    warnings.filterwarnings("ignore", category=FutureWarning)
    ddp, state = hooked_acpsgd()
    sgd_steps(ddp, rank, range(3))
    torch.save((ddp.module.state_dict(), state.state_dict()), f"{directory}/{rank}.pt")
    sgd_steps(ddp, rank, range(3, 6))
    return [p.detach().clone() for p in ddp.parameters()]


def resumed(rank, world_size, directory):
    warnings.filterwarnings("ignore", category=FutureWarning)
    ddp, state = hooked_acpsgd()
    model_state, hook_state = torch.load(f"{directory}/{rank}.pt")
    ddp.module.load_state_dict(model_state)
    state.load_state_dict(hook_state)
    sgd_steps(ddp, rank, range(3, 6))
    return [p.detach().clone() for p in ddp.parameters()]


def main():
    with tempfile.TemporaryDirectory() as directory:
        uninterrupted = run_distributed(saved_midway, 3, directory, timeout=300)
        again = run_distributed(resumed, 3, directory, timeout=300)
    print("world size 3, uninterrupted vs resumed after step 6")
    for rank, (ours, theirs) in enumerate(zip(uninterrupted, again, strict=True)):
        differ = sum(int((a != b).sum()) for a, b in zip(ours, theirs, strict=True))
        largest = max((a - b).abs().max().item() for a, b in zip(ours, theirs, strict=True))
        worst = max(int(ulps(a, b).max()) for a, b in zip(ours, theirs, strict=True))
        total = sum(a.numel() for a in ours)
        print(
            f"rank {rank}: {differ} of {total} parameter elements differ, "
            f"largest {largest:.3g} ({worst} ulp)"
        )


if __name__ == "__main__":
    main()
