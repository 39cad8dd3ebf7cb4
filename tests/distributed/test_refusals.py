"""Calls that would silently give a wrong or rank-dependent answer are refused up front."""

from __future__ import annotations

import types

import pytest
import torch

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.collectives import checks
from commpress.testing.silence import forbid_communication


def _refused(rank, world_size):
    if rank != 0:  # the peer never enters a collective: a call that communicated would hang
        return None
    calls = {
        "float64 sum": lambda: cp.reduce_scatter_tensor(
            torch.zeros(4, dtype=torch.float64), torch.zeros(8, dtype=torch.float64), codec="none"
        ),
        "int64 all_reduce": lambda: cp.all_reduce(torch.zeros(8, dtype=torch.int64), codec="none"),
        "zfp ring-hop all_gather": lambda: cp.all_gather_into_tensor(
            torch.zeros(16), torch.zeros(8), codec="zfp", algorithm="ring-hop"
        ),
        "zfp ring-hop all_reduce": lambda: cp.all_reduce(
            torch.zeros(8), codec="zfp", algorithm="ring-hop"
        ),
        "stochastic ring-hop all_gather": lambda: cp.all_gather_into_tensor(
            torch.zeros(16), torch.zeros(8), codec="int8:stochastic=true", algorithm="ring-hop"
        ),
        "zfp ring-hop ddp hook": lambda: cp.ddp.hook("zfp@ring-hop", group=object()),
        "multicast off the CPU": lambda: cp.all_gather_into_tensor(
            torch.zeros(16, device="meta"), torch.zeros(8, device="meta"), algorithm="multicast"
        ),
    }
    errors = {}
    with forbid_communication() as attempted:
        for name, call in calls.items():
            try:
                call()
            except (TypeError, ValueError) as error:
                errors[name] = (type(error).__name__, str(error))
    assert attempted == []
    return errors


def test_multicast_refuses_tensors_off_the_cpu_and_cuda():
    errors = run_distributed(_refused, 2, timeout=60)[0]
    kind, message = errors["multicast off the CPU"]
    assert kind == "ValueError" and "CPU or CUDA tensors" in message and "meta" in message


@pytest.mark.parametrize(
    "device, backend, refused",
    [("cpu", "gloo", False), ("cuda", "gloo", False), ("cpu", "nccl", True),
     ("cuda", "nccl", True), ("cuda", "cpu:gloo,cuda:nccl", True), ("meta", "gloo", True)],
)  # fmt: skip
def test_multicast_takes_cuda_tensors_only_on_a_group_that_moves_cpu_tensors(
    monkeypatch, device, backend, refused
):
    """Its payloads are staged through host memory, but its channel's set-up and each
    call's argument check move CPU tensors on the group: not on NCCL (which FSDP2 on GPUs
    uses), where they would go untested."""
    monkeypatch.setattr(checks.dist, "get_backend", lambda group: backend)
    tensor = types.SimpleNamespace(device=torch.device(device))
    if refused:
        with pytest.raises(ValueError, match="multicast"):
            checks.check_device("multicast", "all_gather", tensor, None)
    else:
        checks.check_device("multicast", "all_gather", tensor, None)


def _accepted(rank, world_size):
    """What stays allowed: a lossless ring-hop, an idempotent codec over ring-hop, and the
    float64 all-gather that `none` moves without arithmetic."""
    out = torch.empty(16, dtype=torch.float64)
    cp.all_gather_into_tensor(out, torch.full((8,), 1 + 2**-40, dtype=torch.float64), codec="none")
    exact = bool(torch.all(out == 1 + 2**-40))
    gathered = torch.empty(16)
    cp.all_gather_into_tensor(gathered, torch.randn(8), codec="int8", algorithm="ring-hop")
    return exact


def test_inexact_sums_and_rank_dependent_all_gathers_are_refused():
    errors = run_distributed(_refused, 2, timeout=60)[0]
    assert errors["float64 sum"][0] == "TypeError"
    assert "inp.dtype=torch.float64" in errors["float64 sum"][1]
    assert "accumulate in float32" in errors["float64 sum"][1]
    assert "tensor.dtype=torch.int64" in errors["int64 all_reduce"][1]
    for name in ("zfp ring-hop all_gather", "zfp ring-hop all_reduce"):
        kind, message = errors[name]
        assert kind == "ValueError" and "zfp is not idempotent" in message
    assert "int8:stochastic=true is not idempotent" in errors["stochastic ring-hop all_gather"][1]
    assert errors["zfp ring-hop ddp hook"][1].startswith("codec='zfp@ring-hop': ring-hop")


def test_what_stays_allowed_still_works():
    assert all(run_distributed(_accepted, 2, timeout=60))
