"""cp.ddp.hook against DistributedDataParallel's own all-reduce (gloo)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

import commpress as cp
from commpress.testing.distributed import run_distributed
from commpress.testing.training import sgd_steps

STEPS = 4


def _train(rank, world_size, spec):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))
    ddp = DistributedDataParallel(model)
    state = None
    if spec is not None:
        state, hook = cp.ddp.hook(spec)
        ddp.register_comm_hook(state, hook)
    losses = sgd_steps(ddp, STEPS, rank, features=32, batch=16, seed_stride=100)
    stats = None if state is None else state.stats.snapshot()
    return losses, [p.detach().clone() for p in model.parameters()], stats


@pytest.fixture(scope="module")
def runs():
    return {
        spec: run_distributed(_train, 2, spec, timeout=120)
        for spec in (None, "none", "none@native", "int8", "int8@alltoall")
    }


@pytest.mark.parametrize("spec", ["none", "none@native"])
def test_uncompressed_hook_matches_ddp_bit_for_bit(runs, spec):
    for (losses, params, _), (plain_losses, plain_params, _) in zip(
        runs[spec], runs[None], strict=True
    ):
        assert losses == plain_losses
        assert all(torch.equal(a, b) for a, b in zip(params, plain_params, strict=True))


@pytest.mark.parametrize("spec", ["int8", "int8@alltoall"])
def test_int8_hook_stays_within_two_percent_and_ranks_agree(runs, spec):
    (losses, params, stats), (_, other_params, _) = runs[spec]
    plain_losses = runs[None][0][0]
    assert losses != plain_losses
    assert abs(losses[-1] / plain_losses[-1] - 1) < 0.02
    assert all(torch.equal(a, b) for a, b in zip(params, other_params, strict=True))
    assert stats["calls"] >= STEPS and stats["wire_bytes"] < stats["raw_bytes"] / 3


def test_bad_hook_spec_names_the_argument():
    with pytest.raises(ValueError, match="codec='int8@tree'"):
        cp.ddp.hook("int8@tree", group=object())
