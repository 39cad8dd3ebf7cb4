"""Calls that would silently give a wrong or rank-dependent answer are refused up front."""

from __future__ import annotations

import types
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.collectives import checks
from commpress.testing.silence import forbid_communication


def _errors_without_communication(calls: dict) -> dict:
    """``name -> (error type, message)`` of each call, none of which may communicate."""
    errors = {}
    with forbid_communication() as attempted:
        for name, call in calls.items():
            try:
                call()
            except (TypeError, ValueError) as error:
                errors[name] = (type(error).__name__, str(error))
    assert attempted == []
    return errors


def _refused(rank, world_size):
    if rank != 0:  # the peer never enters a collective: a call that communicated would hang
        return None
    calls = {
        "float64 sum": lambda: cp.reduce_scatter_tensor(
            torch.zeros(4, dtype=torch.float64), torch.zeros(8, dtype=torch.float64), codec="none"
        ),
        "int64 all_reduce": lambda: cp.all_reduce(torch.zeros(8, dtype=torch.int64), codec="none"),
        "float64 int8 all_reduce": lambda: cp.all_reduce(
            torch.zeros(8, dtype=torch.float64), codec="int8"
        ),
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
        "ring all_gather on meta": lambda: cp.all_gather_into_tensor(
            torch.zeros(16, device="meta"), torch.zeros(8, device="meta")
        ),
        "backend reduce_scatter on meta": lambda: cp.reduce_scatter_tensor(
            torch.zeros(8, device="meta"), torch.zeros(16, device="meta"), algorithm="backend"
        ),
        "all_reduce on meta": lambda: cp.all_reduce(torch.zeros(8, device="meta")),
    }
    return _errors_without_communication(calls)


def test_multicast_refuses_tensors_off_the_cpu_and_cuda():
    errors = run_distributed(_refused, 2, timeout=60)[0]
    kind, message = errors["multicast off the CPU"]
    assert kind == "ValueError" and "CPU or CUDA tensors" in message and "meta" in message


def test_tensors_on_a_device_no_backend_of_the_group_moves_are_refused_up_front():
    """Before, meta tensors with any compressed algorithm ran the argument check's
    all-reduce, then raised NotImplementedError ("Cannot copy out of meta tensor")."""
    errors = run_distributed(_refused, 2, timeout=60)[0]
    for name, argument in (
        ("ring all_gather on meta", "inp"),
        ("backend reduce_scatter on meta", "inp"),
        ("all_reduce on meta", "tensor"),
    ):
        kind, message = errors[name]
        assert kind == "ValueError", name
        assert f"{argument} is on meta, and a gloo group moves no meta tensors" in message


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
    config = {"gloo": "cpu:gloo,cuda:gloo", "nccl": "cuda:nccl"}.get(backend, backend)
    monkeypatch.setattr(checks.dist, "get_backend", lambda group: backend)
    monkeypatch.setattr(checks.dist, "get_backend_config", lambda group: config)
    monkeypatch.setattr(checks.dist, "get_world_size", lambda group: 2)
    tensor = types.SimpleNamespace(device=torch.device(device))
    # CPU tensors on NCCL alone, and tensors no backend moves, are refused before
    # multicast's own check, for every algorithm
    message = "inp is on the CPU" if (device, backend) == ("cpu", "nccl") else "multicast"
    message = "moves no meta tensors" if device == "meta" else message
    if refused:
        with pytest.raises(ValueError, match=message):
            checks.check_device("multicast", "all_gather", tensor, None)
    else:
        checks.check_device("multicast", "all_gather", tensor, None)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_multicast_refused_on_a_mixed_group_says_why_without_denying_its_gloo(monkeypatch, device):
    """A group that moves CPU tensors with gloo and CUDA tensors with NCCL was refused
    saying it "cannot move" CPU tensors, which it moves (with gloo): the refusal is of the
    NCCL half, which carries CUDA tensors."""
    backend = "cpu:gloo,cuda:nccl"
    monkeypatch.setattr(checks.dist, "get_backend", lambda group: backend)
    monkeypatch.setattr(checks.dist, "get_backend_config", lambda group: backend)
    monkeypatch.setattr(checks.dist, "get_world_size", lambda group: 2)
    tensor = types.SimpleNamespace(device=torch.device(device))
    with pytest.raises(ValueError) as refused:
        checks.check_device("multicast", "all_gather", tensor, None)
    message = str(refused.value)
    assert "cannot move" not in message, message
    assert "gloo group" in message and "NCCL" in message, message


def _accepted(rank, world_size):
    """What stays allowed: a lossless ring-hop, an idempotent codec over ring-hop, and the
    float64 all-gather that `none` moves without arithmetic."""
    out = torch.empty(16, dtype=torch.float64)
    shard = torch.full((8,), rank + 2**-40, dtype=torch.float64)
    cp.all_gather_into_tensor(out, shard, codec="none")
    exact = torch.equal(out, torch.arange(2.0, dtype=torch.float64).repeat_interleave(8) + 2**-40)
    gathered = torch.empty(16)
    cp.all_gather_into_tensor(
        gathered, torch.linspace(-1, 1, 8) * (rank + 1), codec="int8", algorithm="ring-hop"
    )
    expected = torch.cat([torch.linspace(-1, 1, 8) * (r + 1) for r in range(world_size)])
    return exact and bool((gathered - expected).abs().max() <= 2 / 254 * 1.001)


def test_inexact_sums_and_rank_dependent_all_gathers_are_refused():
    errors = run_distributed(_refused, 2, timeout=60)[0]
    assert errors["float64 sum"][0] == "TypeError"
    assert "inp.dtype=torch.float64" in errors["float64 sum"][1]
    assert "accumulate in float32" in errors["float64 sum"][1]
    assert "tensor.dtype=torch.int64" in errors["int64 all_reduce"][1]
    # a lossy codec's dtype error would send the caller to codec 'none', refused in turn
    kind, message = errors["float64 int8 all_reduce"]
    assert kind == "TypeError" and "algorithm='native'" in message and "'none'" not in message
    for name in ("zfp ring-hop all_gather", "zfp ring-hop all_reduce"):
        kind, message = errors[name]
        assert kind == "ValueError" and "zfp is not idempotent" in message
    assert "int8:stochastic=true is not idempotent" in errors["stochastic ring-hop all_gather"][1]
    assert errors["zfp ring-hop ddp hook"][1].startswith("codec='zfp@ring-hop': ring-hop")


def test_what_stays_allowed_still_works():
    assert all(run_distributed(_accepted, 2, timeout=60))


def _bad_timeouts_and_shapes(rank, world_size):
    if rank != 0:  # the peer never enters a collective: a call that communicated would hang
        return None
    five = timedelta(seconds=5)
    calls = {
        "int timeout, all_gather": lambda: cp.all_gather_into_tensor(
            torch.zeros(16), torch.zeros(8), timeout=5
        ),
        "float timeout, reduce_scatter": lambda: cp.reduce_scatter_tensor(
            torch.zeros(8), torch.zeros(16), timeout=5.0
        ),
        "negative timeout, all_reduce": lambda: cp.all_reduce(torch.zeros(8), timeout=-five),
        "endless timeout, all_gather": lambda: cp.all_gather_into_tensor(
            torch.zeros(16), torch.zeros(8), timeout=timedelta.max
        ),
        "int timeout, ddp hook": lambda: cp.ddp.hook("int8", group=object(), timeout=5),
        "0-dim inp": lambda: cp.all_gather_into_tensor(torch.zeros(2), torch.tensor(1.0)),
        "0-dim out": lambda: cp.reduce_scatter_tensor(torch.tensor(1.0), torch.zeros(2)),
    }
    return _errors_without_communication(calls)


def test_a_timeout_that_is_not_a_timedelta_and_0_dim_tensors_are_refused_up_front():
    """Before, an int timeout reached gloo's ``wait`` mid-call on the rank that gave it
    (the others returned), a 0-dim ``inp`` raised an IndexError on the communication
    thread, and ``timedelta.max`` (meant as "never") made gloo's transfers time out at once
    (its deadline overflows) or hang."""
    errors = run_distributed(_bad_timeouts_and_shapes, 2)[0]
    for name in (
        "int timeout, all_gather",
        "float timeout, reduce_scatter",
        "int timeout, ddp hook",
    ):
        kind, message = errors[name]
        assert kind == "TypeError" and "timeout must be a datetime.timedelta" in message, name
    assert errors["negative timeout, all_reduce"][0] == "ValueError"
    assert "timeout must be positive" in errors["negative timeout, all_reduce"][1]
    kind, message = errors["endless timeout, all_gather"]
    assert kind == "ValueError" and "timeout must be at most 10000 days" in message
    assert errors["0-dim inp"][0] == errors["0-dim out"][0] == "ValueError"
    assert "inp is a 0-dim tensor" in errors["0-dim inp"][1]
    assert "out is a 0-dim tensor" in errors["0-dim out"][1]


def _bad_groups_and_flags(rank, world_size):
    if rank != 0:  # the peer never enters a collective: a call that communicated would hang
        return None
    world = dist.group.WORLD
    calls = {
        "all_gather, group": lambda: cp.all_gather_into_tensor(
            torch.zeros(16), torch.zeros(8), group="oops"
        ),
        "all_gather, async_op": lambda: cp.all_gather_into_tensor(
            torch.zeros(16), torch.zeros(8), async_op="no"
        ),
        "reduce_scatter, async_op": lambda: cp.reduce_scatter_tensor(
            torch.zeros(8), torch.zeros(16), async_op="no"
        ),
        "all_reduce, async_op": lambda: cp.all_reduce(torch.zeros(8), async_op=1),
        "ddp hook, group": lambda: cp.ddp.hook("int8", group="oops"),
        "ddp hook, not a member": lambda: cp.ddp.hook(
            "int8", group=dist.GroupMember.NON_GROUP_MEMBER
        ),
        "low-rank hook, group": lambda: cp.lowrank.ddp_hook("powersgd", group="oops"),
        "low-rank hook, scheduler": lambda: cp.lowrank.ddp_hook(
            "powersgd", group=world, scheduler="no"
        ),
        "low-rank hook, model": lambda: cp.lowrank.ddp_hook("powersgd", group=world, model="m"),
        "fsdp, error_feedback": lambda: cp.fsdp.compress(
            torch.nn.Linear(2, 2), "int8", "int8@alltoall", error_feedback="no"
        ),
        "fsdp, unshard_async_op": lambda: cp.fsdp.compress(
            torch.nn.Linear(2, 2), unshard_async_op="yes"
        ),
        "fsdp, unshard_async_op without all_gather": lambda: cp.fsdp.compress(
            torch.nn.Linear(2, 2), None, "int8", unshard_async_op=True
        ),
    }
    return _errors_without_communication(calls)


def test_a_group_or_a_flag_of_the_wrong_type_is_refused_up_front():
    """A string group once passed, to fail in the first backward; ``"no"`` read as True
    (a collective's ``async_op="no"`` returned at once, its output not yet written)."""
    errors = run_distributed(_bad_groups_and_flags, 2)[0]
    expected = {
        "all_gather, group": "group must be a torch.distributed.ProcessGroup or None, got str",
        "ddp hook, group": "group must be a torch.distributed.ProcessGroup or None, got str",
        "low-rank hook, group": "group must be a torch.distributed.ProcessGroup or None",
        "low-rank hook, scheduler": "scheduler must be True or False, got 'no'",
        "low-rank hook, model": "model must be the torch.nn.Module DDP wraps, got str",
        "fsdp, error_feedback": "error_feedback must be True or False, got 'no'",
        "fsdp, unshard_async_op": "unshard_async_op must be True or False, got 'yes'",
        "all_gather, async_op": "async_op must be True or False, got 'no'",
        "reduce_scatter, async_op": "async_op must be True or False, got 'no'",
        "all_reduce, async_op": "async_op must be True or False, got 1",
    }
    for name, message in expected.items():
        assert errors.get(name, (None, ""))[0] == "TypeError", (name, errors.get(name))
        assert message in errors[name][1], name
    kind, message = errors["ddp hook, not a member"]
    assert kind == "ValueError" and "this rank is not a member of the group" in message
    kind, message = errors["fsdp, unshard_async_op without all_gather"]
    assert kind == "ValueError" and "all_gather is None" in message


def _wait_with_a_number(rank, world_size):
    work = cp.all_reduce(torch.ones(8), codec="none", async_op=True)
    messages = []
    for timeout in (5, timedelta.max):
        try:
            work.wait(timeout)
        except (TypeError, ValueError) as error:
            messages.append(str(error))
    work.wait()
    return messages


def test_an_async_handle_refuses_a_timeout_that_is_not_a_timedelta():
    """``timedelta.max`` once raised OverflowError ("timestamp out of range")."""
    for number, endless in run_distributed(_wait_with_a_number, 2):
        assert "timeout must be a datetime.timedelta" in number
        assert "timeout must be at most 10000 days" in endless


def _outside_a_group(rank, world_size):
    import warnings

    group = dist.new_group([0, 1])
    calls = {
        "all_gather": lambda: cp.all_gather_into_tensor(torch.zeros(8), torch.ones(4), group),
        "reduce_scatter": lambda: cp.reduce_scatter_tensor(
            torch.zeros(4), torch.ones(8), group=group
        ),
        "all_reduce": lambda: cp.all_reduce(torch.ones(4), group=group),
    }
    results = {}
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = call()
        results[name] = (value, [str(w.message) for w in caught])
    return results


def test_a_rank_outside_the_group_does_nothing_as_torch_does():
    """Rank 2 is not in the group of ranks 0 and 1: like torch.distributed, the call returns
    None at once with a warning (before: a ValueError that spoke of world_size=-1). The
    members still run the collective between them."""
    results = run_distributed(_outside_a_group, 3, timeout=120)
    for name, (value, warned) in results[2].items():
        assert value is None, name
        assert any("not in the group" in message for message in warned), name
    for rank in (0, 1):
        for name, (_, warned) in results[rank].items():
            assert not any("not in the group" in message for message in warned), (rank, name)


def _one_rank_with_bad_multicast_options(rank, world_size):
    import os

    from commpress.transport import multicast

    if rank == 1:
        os.environ[multicast.ENVIRONMENT] = "loss=2"
    try:
        multicast.channel_for(None)
    except Exception as error:  # noqa: BLE001 - the test looks at what each rank raised
        return type(error).__name__, str(error)
    return None


def test_one_rank_with_bad_multicast_options_makes_every_rank_raise():
    """Only the rank with the bad option raised; the others waited in the channel's set-up
    for the process group's timeout (30 minutes by default)."""
    for name, message in run_distributed(_one_rank_with_bad_multicast_options, 3, timeout=60):
        assert name == "MulticastSetupError"
        assert "rank 1: COMMPRESS_MULTICAST: loss must be a probability" in message


def _multicast_on_a_subgroup(rank, world_size):
    """Ranks 1 and 2 of three multicast in a group of their own, on loopback (which cannot)."""
    group = dist.new_group([1, 2])
    if rank == 0:
        return None
    try:
        cp.all_gather_into_tensor(torch.empty(16), torch.ones(8), group, algorithm="multicast")
    except Exception as error:  # noqa: BLE001 - the test looks at what each rank raised
        return type(error).__name__, str(error)
    return None


def test_a_multicast_that_cannot_set_up_on_a_subgroup_names_the_global_ranks_once():
    """It said "rank 0: cannot tell which interface ...; rank 1: cannot tell which
    interface ...": the same words once per rank, named by their rank in the subgroup."""
    _, first, second = run_distributed(_multicast_on_a_subgroup, 3, timeout=60)
    assert first == second
    name, message = first
    assert name == "MulticastSetupError"
    assert message.startswith(
        "multicast cannot be set up: ranks 0, 1 (global ranks 1, 2): cannot tell which "
    ), message
    assert message.count("cannot tell which interface") == 1, message


def _multicast_that_cannot_bind_then_what_its_frames_held(rank, world_size):
    """Whether the shard, held by the frames the setup error passed through, is freed once
    the error is handled, without a gc pass."""
    import concurrent.futures.thread as pool
    import gc
    import os
    import time
    import weakref

    from commpress.collectives.work import launch

    finish = pool._WorkItem.run

    def lingering(item):  # the communication thread stays a while after each call
        finish(item)
        del item  # the thread's own frame still holds it
        time.sleep(0.5)

    pool._WorkItem.run = lingering  # this rank's process alone
    os.environ["COMMPRESS_MULTICAST_ADDRESS"] = "127.0.0.1"  # found, but cannot multicast
    shard = torch.ones(8)
    freed = weakref.ref(shard)
    gc.disable()
    try:
        with pytest.raises(RuntimeError, match="cannot multicast"):
            cp.all_gather_into_tensor(torch.empty(16), shard, algorithm="multicast")
        del shard
        # the communication thread holds the failed call's handle (and so the error, and
        # the frames its traceback holds) until it takes its next call
        launch(lambda: None, async_op=False)
        return freed() is None
    finally:
        gc.enable()


def test_a_failed_multicast_set_up_leaves_no_reference_cycle():
    """The error held the frames it passed through, and they held the error (the channel's
    set-up kept its cause, the handle its future): the group stayed alive past
    destroy_process_group until a gc pass, and at interpreter exit gloo's thread, releasing a
    finished all-gather of the set-up, found the interpreter finalizing and aborted the
    process ("terminate called without an active exception"; 3 runs in 34). Looked at once
    the communication thread, which lingers here after each call, has let go of the call."""
    rank_function = _multicast_that_cannot_bind_then_what_its_frames_held
    assert run_distributed(rank_function, 2, timeout=60) == [True, True]


def _frames_left_by_refusals_after_an_exchange(rank, world_size):
    """The commpress frames still alive, without a gc pass, after each refusal that every
    rank raises once the ranks have exchanged what they found."""
    import gc
    import types

    from torch.distributed.fsdp import fully_shard

    def frames_left() -> list[str]:
        return [
            frame.f_code.co_name
            for frame in gc.get_objects()
            if isinstance(frame, types.FrameType) and "commpress" in frame.f_code.co_filename
        ]

    model = torch.nn.Sequential(torch.nn.Linear(4, 4)).double()  # int8 encodes no float64
    fully_shard(model, mesh=cp.fsdp.cpu_mesh())
    calls = {
        "tuned": lambda: cp.all_gather_into_tensor(
            torch.empty(16), torch.ones(8), codec="auto:max_rel_err=1e-12,codecs=int8"
        ),
        "fsdp.compress": lambda: cp.fsdp.compress(model),
    }
    left = {}
    gc.collect()
    gc.disable()
    try:
        for name, call in calls.items():
            with pytest.raises((TypeError, ValueError)):
                call()
            left[name] = frames_left()
    finally:
        gc.enable()
    return left


def test_a_refusal_after_an_exchange_leaves_no_frame_behind():
    """The refusal was kept in a local of the frames that raised it, which its traceback
    holds: a cycle that kept the call's group and tensors (fsdp.compress: the model) until
    a gc pass, past destroy_process_group."""
    for left in run_distributed(_frames_left_by_refusals_after_an_exchange, 2, timeout=60):
        assert left == {"tuned": [], "fsdp.compress": []}


def _cpu_tensors_on_an_nccl_group(rank, world_size):
    if rank != 0:
        return None
    dist.get_backend = lambda group=None: "nccl"  # what an NCCL-only group says
    dist.get_backend_config = lambda group=None: "cuda:nccl"
    calls = {
        "all_gather": lambda: cp.all_gather_into_tensor(torch.zeros(16), torch.zeros(8)),
        "reduce_scatter": lambda: cp.reduce_scatter_tensor(torch.zeros(4), torch.zeros(8)),
        "all_reduce": lambda: cp.all_reduce(torch.zeros(8), codec="int8"),
    }
    return _errors_without_communication(calls)


def test_cpu_tensors_on_a_group_that_moves_none_are_refused_before_communicating():
    """Before, torch's "No backend type associated with device type cpu" came from the
    communication thread; at one rank nothing moves, and the call stays allowed."""
    errors = run_distributed(_cpu_tensors_on_an_nccl_group, 2, timeout=60)[0]
    assert set(errors) == {"all_gather", "reduce_scatter", "all_reduce"}
    for op, (kind, message) in errors.items():
        argument = "tensor" if op == "all_reduce" else "inp"
        assert kind == "ValueError", (op, message)
        assert f"{argument} is on the CPU, and a nccl group moves no CPU tensors" in message


def test_an_algorithm_of_another_collective_is_not_called_unknown():
    """``reduce_scatter='int8@multicast'`` said "unknown algorithm 'multicast'"."""
    with pytest.raises(ValueError, match="'multicast' does not run this collective"):
        checks.check_algorithm("multicast", ("native", "ring", "alltoall"))
    with pytest.raises(ValueError, match="unknown algorithm 'tree'"):
        checks.check_algorithm("tree", ("native", "ring"))
    with pytest.raises(ValueError, match="'auto' chooses for all_gather_into_tensor and"):
        checks.check_algorithm("auto", ("native", "ring"))  # all_reduce's (no tuner there)


def _algorithms_of_another_collective(rank, world_size):
    out, inp = torch.empty(8 * world_size), torch.ones(8)
    calls = {
        "all_gather_into_tensor": lambda: cp.all_gather_into_tensor(out, inp, algorithm="alltoall"),
        "reduce_scatter_tensor": lambda: cp.reduce_scatter_tensor(inp, out, algorithm="multicast"),
        "all_reduce": lambda: cp.all_reduce(inp, algorithm="multicast"),
    }
    errors = {}
    for name, call in calls.items():
        try:
            call()
        except ValueError as error:
            errors[name] = str(error)
    return errors


def test_a_collective_given_another_collectives_algorithm_names_itself():
    """``cp.all_gather_into_tensor(..., algorithm="alltoall")`` said "does not run this
    collective", which the reader had to work out."""
    (errors,) = run_distributed(_algorithms_of_another_collective, 1, timeout=60)
    assert errors["all_gather_into_tensor"].startswith(
        "algorithm 'alltoall' does not run all_gather_into_tensor; known: ("
    )
    assert (
        "'multicast' does not run reduce_scatter_tensor; known:" in errors["reduce_scatter_tensor"]
    )
    assert "'multicast' does not run all_reduce; known:" in errors["all_reduce"]


def _auto_codec_on_all_reduce(rank, world_size):
    tensor = torch.ones(8)
    return _errors_without_communication(
        {
            codec: lambda codec=codec: cp.all_reduce(tensor, codec=codec)
            for codec in ("auto", "auto:max_rel_err=1e-2", "auto :max_rel_err=1e-2")
        }
    )


def test_an_auto_codec_on_all_reduce_is_not_called_unknown():
    """``cp.all_reduce(t, codec="auto")`` said "unknown codec 'auto'", a spec the other two
    collectives take."""
    for errors in run_distributed(_auto_codec_on_all_reduce, 2):
        assert set(errors) == {"auto", "auto:max_rel_err=1e-2", "auto :max_rel_err=1e-2"}
        for kind, message in errors.values():
            assert kind == "ValueError"
            assert "'auto' chooses for all_gather_into_tensor and reduce_scatter_tensor" in message


def _reduce_ops(rank, world_size):
    average = torch.full((4,), float(rank))
    cp.all_reduce(average, dist.ReduceOp(dist.ReduceOp.AVG), codec="none")
    total = torch.zeros(2)
    cp.reduce_scatter_tensor(total, torch.ones(4), dist.ReduceOp(dist.ReduceOp.SUM), codec="none")
    refused = _errors_without_communication(
        {
            "True": lambda: cp.all_reduce(torch.ones(4), True, codec="none"),
            "0": lambda: cp.reduce_scatter_tensor(torch.zeros(2), torch.ones(4), 0),
            "premul sum": lambda: cp.all_reduce(
                torch.ones(4), dist._make_nccl_premul_sum(2.0), codec="none"
            ),
        }
    )
    largest = torch.tensor([float(rank), -float(rank)])
    cp.all_reduce(largest, dist.ReduceOp.MAX, algorithm="native")
    smallest = torch.zeros(2)
    contributions = torch.tensor([float(rank), -float(rank)] * world_size)
    cp.reduce_scatter_tensor(smallest, contributions, dist.ReduceOp.MIN, algorithm="native")
    return average, total, refused, largest, smallest


def test_reduce_ops_are_taken_as_torch_takes_them():
    """Before, ``ReduceOp(ReduceOp.AVG)``, which torch takes, was refused with the object's
    repr, while ``op=True`` averaged and ``op=0`` summed where torch raises; and
    ``algorithm="native"``, torch's own collective, refused MAX and MIN, which torch takes."""
    for average, total, refused, largest, smallest in run_distributed(_reduce_ops, 2):
        assert torch.equal(average, torch.full((4,), 0.5))
        assert torch.equal(total, torch.full((2,), 2.0))
        assert torch.equal(largest, torch.tensor([1.0, 0.0]))
        assert torch.equal(smallest, torch.tensor([0.0, -1.0]))
        for name in ("True", "0"):
            kind, message = refused[name]
            assert kind == "TypeError" and "op must be a torch.distributed.ReduceOp" in message
        kind, message = refused["premul sum"]
        assert kind == "ValueError"
        assert "op must be ReduceOp.SUM or ReduceOp.AVG, got RedOpType.PREMUL_SUM" in message
        assert "algorithm='native' takes torch's other ops" in message


def _hooks_on_a_destroyed_group(rank, world_size):
    from commpress.lowrank import PowerSGD, Reducer

    group = dist.new_group([0, 1])
    dist.barrier(group)  # destroyed while a peer still connects, it would fail the peer's new_group
    dist.destroy_process_group(group)
    return _errors_without_communication(
        {
            "ddp.hook": lambda: cp.ddp.hook("int8@ring", group=group),
            "lowrank.ddp_hook": lambda: cp.lowrank.ddp_hook("powersgd", group=group),
            "Reducer": lambda: Reducer(PowerSGD(rank=2), group),
            "all_reduce": lambda: cp.all_reduce(torch.ones(4), group=group),
        }
    )


def test_a_hook_on_a_destroyed_group_is_refused_saying_so():
    """A hook given a destroyed group (one commpress destroyed after a collective on it
    failed, say) was made without a word, to fail at its first bucket; a collective raised
    torch's "Group ... is not registered", which does not say what happened."""
    for errors in run_distributed(_hooks_on_a_destroyed_group, 2, timeout=60):
        assert set(errors) == {"ddp.hook", "lowrank.ddp_hook", "Reducer", "all_reduce"}, errors
        for kind, message in errors.values():
            assert kind == "ValueError", errors
            assert message.startswith("group: its process group was destroyed"), errors
