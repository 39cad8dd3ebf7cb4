"""Which backend moves a group's tensors, read from the pairs torch chose for the group
(``dist.get_backend_config``), not from the name it was made with: a group made without
naming one (``init_process_group()``, which ``init_device_mesh`` calls where nothing is
initialised) is ``"undefined"`` by name, and on a machine with a GPU it is NCCL alone
("cuda:nccl": no backend for CPU tensors). What each machine reports is patched in."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist

from commpress.collectives import checks, fingerprint
from commpress.transport import p2p

#: (dist.get_backend, dist.get_backend_config) of groups made in these ways
GLOO = ("gloo", "cpu:gloo,cuda:gloo")
NCCL = ("nccl", "cuda:nccl")
MIXED = ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl")
UNNAMED_ON_A_GPU_MACHINE = ("undefined", "cuda:nccl")
UNNAMED_ON_A_CPU_MACHINE = ("undefined", "cpu:gloo")


@pytest.fixture
def made(monkeypatch):
    def make(reported):
        name, config = reported
        monkeypatch.setattr(dist, "get_backend", lambda group=None: name)
        monkeypatch.setattr(dist, "get_backend_config", lambda group=None: config)

    return make


@pytest.mark.parametrize(
    "reported, cpu, cuda",
    [(GLOO, "gloo", "gloo"), (NCCL, None, "nccl"), (MIXED, "gloo", "nccl"),
     (UNNAMED_ON_A_GPU_MACHINE, None, "nccl"), (UNNAMED_ON_A_CPU_MACHINE, "gloo", None)],
)  # fmt: skip
def test_the_backend_of_each_device(made, reported, cpu, cuda):
    from commpress.transport import backends

    made(reported)
    assert backends.moves(None, "cpu") == cpu and backends.moves(None, "cuda") == cuda


def test_the_backend_of_each_device_follows_the_group_asked_about(monkeypatch):
    from commpress.transport import backends

    configs = {"a": GLOO[1], "b": NCCL[1], "c": UNNAMED_ON_A_CPU_MACHINE[1]}
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: configs[group])
    for _ in range(2):  # read again: each group still gets its own
        assert [backends.moves(g, "cpu") for g in "abc"] == ["gloo", None, "gloo"]
        assert [backends.moves(g, "cuda") for g in "abc"] == ["gloo", "nccl", None]
    configs["a"] = NCCL[1]
    assert backends.moves("a", "cpu") is None


@pytest.mark.parametrize(
    "reported, staged, alone, digest_on",
    [(GLOO, True, True, "cpu"), (NCCL, False, False, "cuda"), (MIXED, False, True, "cpu"),
     (UNNAMED_ON_A_GPU_MACHINE, False, False, "cuda"),
     (UNNAMED_ON_A_CPU_MACHINE, True, True, "cpu")],
)  # fmt: skip
def test_cuda_tensors_go_where_the_group_moves_them(made, reported, staged, alone, digest_on):
    """A group that NCCL alone moves gets its CUDA tensors unstaged and the argument
    check's digest on the GPU: host memory has no backend there (before, a group made
    without naming a backend had every message staged into host memory and its digest
    all-reduced on the CPU, which NCCL refuses: every compressed collective failed)."""
    made(reported)
    assert p2p.must_stage(None, on_cpu=False) is staged
    assert p2p.sends_may_go_alone(None) is alone
    device = torch.device("cuda", 0)
    assert fingerprint.fingerprint_device(None, device).type == digest_on


@pytest.mark.parametrize(
    "reported, refused",
    [(GLOO, False), (NCCL, True), (MIXED, True), (UNNAMED_ON_A_GPU_MACHINE, True),
     (UNNAMED_ON_A_CPU_MACHINE, False)],
)  # fmt: skip
def test_multicast_needs_a_group_without_nccl_whatever_its_name(made, reported, refused):
    made(reported)
    tensor = types.SimpleNamespace(device=torch.device("cuda", 0))
    if refused:
        with pytest.raises(ValueError, match="cuda:nccl|nccl"):
            checks.check_device("multicast", "all_gather", tensor, None)
    else:
        checks.check_device("multicast", "all_gather", tensor, None)


@pytest.mark.parametrize(
    "reported, refused",
    [(GLOO, False), (NCCL, True), (MIXED, False), (UNNAMED_ON_A_GPU_MACHINE, True),
     (UNNAMED_ON_A_CPU_MACHINE, False)],
)  # fmt: skip
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
def test_cpu_tensors_on_a_group_that_moves_none_are_refused_up_front(
    monkeypatch, made, reported, refused, op
):
    """Before, a CPU tensor on an NCCL-only group with `ring` failed inside the collective
    (torch's "No backend type associated with device type cpu"), on the communication
    thread. At one rank nothing moves: allowed, as before."""
    made(reported)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    checks.check_device("ring", op, torch.zeros(4), None)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    tensor = torch.zeros(4)
    argument = "tensor" if op == "all_reduce" else "inp"
    if refused:
        with pytest.raises(ValueError, match=f"{argument} is on the CPU.*moves no CPU tensors"):
            checks.check_device("ring", op, tensor, None, argument)
    else:
        checks.check_device("ring", op, tensor, None, argument)
    checks.check_device("native", op, tensor, None, argument)  # torch's own says it itself


@pytest.mark.parametrize(
    "call",
    [lambda m: m.configure(rate_bits=10**9), lambda m: m.options_of(None),
     lambda m: m.options_set_for(None), lambda m: m.channel_for(None)],
)  # fmt: skip
def test_the_multicast_options_of_the_default_group_before_init_process_group(call):
    """Before ``init_process_group`` the default group is None, which the weak dictionaries
    of options and channels cannot key: "cannot create weak reference to 'NoneType'
    object", instead of saying that the process group is not initialised."""
    from commpress.transport import multicast

    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        call(multicast)


def test_objects_are_exchanged_on_the_group_s_device(monkeypatch):
    """A group that moves no CPU tensors exchanges them on this process's accelerator, as
    torch's own object collectives do (it assumed CUDA)."""
    import torch

    from commpress.transport import objects

    monkeypatch.setattr(objects.backends, "moves", lambda group, kind: None)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("xpu"))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 3)
    assert objects._device(None) == torch.device("xpu", 3)
    monkeypatch.setattr(objects.backends, "moves", lambda group, kind: "gloo")
    assert objects._device(None) == torch.device("cpu")
