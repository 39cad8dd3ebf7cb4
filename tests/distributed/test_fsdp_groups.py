"""cp.fsdp.compress gives its collectives process groups of their own.

FSDP2 issues torch's own collectives (here an uncompressed reduce-scatter) from the
training thread while commpress's compressed all-gathers, prefetched, run on the
communication thread: on one shared group their order could differ between ranks,
which hangs NCCL. Each of FSDP's groups gets a twin with the same ranks.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

import commpress as cp
from commpress import _torch_private
from commpress.cluster.local import run_distributed
from commpress.integrations import fsdp as fsdp_integration

STEPS = 3


def _model(prefetch: bool) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)], nn.Linear(32, 10))
    mesh = cp.fsdp.cpu_mesh()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if prefetch:
        layers = list(model)
        for index, layer in enumerate(layers[:-1]):
            layer.set_modules_to_forward_prefetch([layers[index + 1]])
        for index, layer in enumerate(layers[1:], start=1):
            layer.set_modules_to_backward_prefetch([layers[index - 1]])
    return model


def _train(model, rank) -> list[torch.Tensor]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 32, generator=generator)
        y = torch.randint(0, 10, (8,), generator=generator)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def _mixed(rank, world_size):
    used_groups, asked_async = [], []
    real = fsdp_integration.all_gather_into_tensor
    real_call = fsdp_integration.CompressedAllGather.__call__

    def recording(out, inp, group, **kwargs):
        used_groups.append(group)
        return real(out, inp, group, **kwargs)

    def call(self, output_tensor, input_tensor, group, async_op=False):
        asked_async.append(async_op)
        return real_call(self, output_tensor, input_tensor, group, async_op)

    fsdp_integration.all_gather_into_tensor = recording
    fsdp_integration.CompressedAllGather.__call__ = call
    try:
        results = {}
        for prefetch, blocking in ((False, True), (True, True), (True, False)):
            model = _model(prefetch)
            compression = cp.fsdp.compress(
                model, all_gather="int8", reduce_scatter=None, unshard_async_op=not blocking
            )
            calls_before = len(asked_async)
            results[prefetch, blocking] = _train(model, rank)
        waited_calls = asked_async[calls_before:]
        asked_async = asked_async[:calls_before]
    finally:
        fsdp_integration.all_gather_into_tensor = real
        fsdp_integration.CompressedAllGather.__call__ = real_call
    fsdp_group = _torch_private.fsdp_param_groups(model[0])[0].process_groups[0]

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(results[a], results[b], strict=True))

    return {
        "same": same((False, True), (True, True)),
        "same_as_blocking": same((True, False), (True, True)),
        "blocking_asked_async": set(asked_async),
        "waited_asked_async": set(waited_calls),
        "calls": len(used_groups),
        "on_fsdp_group": sum(g is fsdp_group for g in used_groups),
        "twin_ranks": {tuple(dist.get_process_group_ranks(g)) for g in used_groups},
        "twin": compression.groups.twin(fsdp_group) is not fsdp_group,
    }


def test_compressed_all_gather_with_torch_reduce_scatter_and_prefetching():
    """The same bits with and without prefetching, and with FSDP2 blocking the training
    thread on each all-gather (its default) or waiting where it needs the parameters."""
    for result in run_distributed(_mixed, 2, timeout=180):
        assert result["calls"] >= 2 * STEPS * 5  # every layer, forward and backward
        assert result["on_fsdp_group"] == 0, "commpress shared FSDP's group"
        assert result["twin_ranks"] == {(0, 1)}
        assert result["twin"]
        assert result["same"], "prefetching changed the result"
        # FSDP2's default blocks on each all-gather; with unshard_async_op=True it waits
        # only where it needs the parameters, for the same result
        assert result["blocking_asked_async"] == {False}
        assert result["waited_asked_async"] == {True}
        assert result["same_as_blocking"]


def _ring_hop_zfp(rank, world_size):
    try:
        cp.fsdp.compress(_model(False), all_gather="zfp@ring-hop")
    except ValueError as error:
        return str(error)
    return None


def test_a_non_idempotent_codec_is_refused_for_a_ring_hop_all_gather():
    message = run_distributed(_ring_hop_zfp, 2, timeout=60)[0]
    assert message.startswith("all_gather='zfp@ring-hop': ring-hop re-encodes")
    assert "not idempotent" in message


def test_cpu_mesh_refuses_what_it_cannot_make_a_cpu_mesh_of():
    import pytest

    with pytest.raises(TypeError, match="group must be a ProcessGroup"):
        cp.fsdp.cpu_mesh("world")
    assert not dist.is_initialized()  # this test process never joins a group
    with pytest.raises(ValueError, match="init_process_group"):
        cp.fsdp.cpu_mesh()


def test_compress_given_something_other_than_a_module_names_the_argument():
    """It raised AttributeError: 'str' object has no attribute 'named_modules'."""
    import pytest

    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        cp.fsdp.compress("model")


def _meshes(rank, world_size):
    pair = dist.new_group([0, 1])
    whole = cp.fsdp.cpu_mesh()
    shapes = [whole.device_type, whole.mesh.tolist(), whole.get_group() is dist.group.WORLD]
    if rank < 2:
        part = cp.fsdp.cpu_mesh(pair)
        shapes += [part.device_type, part.mesh.tolist()]
    else:
        try:  # rank 2 is not in the pair
            cp.fsdp.cpu_mesh(pair)
        except ValueError as error:
            shapes.append(str(error))
    dist.barrier()  # rank 2 must not leave while the pair still connects
    return shapes


def test_cpu_mesh_is_the_group_itself_on_the_cpu():
    found = run_distributed(_meshes, 3, timeout=60)
    assert found[0] == found[1] == ["cpu", [0, 1, 2], True, "cpu", [0, 1]]
    assert found[2] == ["cpu", [0, 1, 2], True, found[2][3]]
    assert "this rank is not in it" in found[2][3]


def _unnamed_backend_mesh(rank, world_size):
    """A world made without naming a backend (``init_process_group()``): ``"undefined"`` by
    name; gloo where no GPU is visible, NCCL alone where one is (no CPU mesh there)."""
    try:
        mesh = cp.fsdp.cpu_mesh()
    except ValueError as error:
        return [dist.get_backend(), dist.get_backend_config(), str(error)]
    return [dist.get_backend(), mesh.device_type, mesh.mesh.tolist()]


def test_cpu_mesh_of_a_world_made_without_naming_a_backend():
    """Where a GPU is visible (``benchmarks/gpu_2026-11-27/next_gpu_session.sh`` runs this
    file there) torch makes such a world NCCL alone, which moves no CPU tensors: the CPU
    mesh is refused, saying so (the test expected gloo's mesh on every machine). NCCL
    refuses two ranks on one GPU (the ranks' first barrier would fail), so there it runs
    only with two GPUs; the refusal itself is checked on the CPU below."""
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("an NCCL-only world of two ranks needs two GPUs")
    found = run_distributed(_unnamed_backend_mesh, 2, backend=None, timeout=60)
    if torch.cuda.is_available():
        assert found == [["undefined", "cuda:nccl", _NO_CPU_MESH_ON_NCCL]] * 2
    else:
        assert found == [["undefined", "cpu", [0, 1]]] * 2  # before: "a CPU mesh needs gloo"


_NO_CPU_MESH_ON_NCCL = (
    "group's backend is 'cuda:nccl': a CPU mesh needs gloo to move its CPU tensors"
)


def _mesh_of_a_world_said_to_be_nccl_alone(rank, world_size):
    """``cpu_mesh`` in a world whose backend torch reports as a GPU machine's
    ``init_process_group()`` makes it (read through ``get_backend``/``get_backend_config``)."""
    from unittest import mock

    from commpress.transport import backends

    backends._by_device.cache_clear()
    with (
        mock.patch.object(dist, "get_backend", lambda group=None: "undefined"),
        mock.patch.object(dist, "get_backend_config", lambda group=None: "cuda:nccl"),
    ):
        try:
            cp.fsdp.cpu_mesh()
        except ValueError as error:
            return str(error)
    return "no error"


def test_cpu_mesh_refuses_a_world_of_nccl_alone_saying_so():
    """The refusal a GPU machine's unnamed-backend world gets, checked on any machine."""
    assert run_distributed(_mesh_of_a_world_said_to_be_nccl_alone, 1) == [_NO_CPU_MESH_ON_NCCL]


def test_a_reduce_op_object_is_taken_as_its_kind():
    """``ReduceOp(ReduceOp.SUM)`` is not ``in (SUM, AVG)``: FSDP's op check refused what
    the collectives take."""
    import torch.distributed as dist

    from commpress.integrations.fsdp import _sum_or_average

    for kind in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        assert _sum_or_average(dist.ReduceOp(kind), "m") == kind
        assert _sum_or_average(kind, "m") == kind


def _failing_all_gather(rank, world_size, unshard_async_op):
    from commpress.collectives.work import launch

    model = _model(prefetch=False)
    cp.fsdp.compress(model, "int8", None, unshard_async_op=unshard_async_op)

    def failing(output, input, group, **kwargs):
        def fail():
            raise RuntimeError("the all-gather failed")

        return launch(fail, async_op=True)

    fsdp_integration.all_gather_into_tensor = failing  # a forked rank's own copy
    try:
        output = model(torch.randn(3, 32))
    except RuntimeError as error:
        return str(error)
    return f"the forward went on: {output}"


def test_a_failed_all_gather_raises_whether_fsdp_blocks_or_waits():
    """With ``unshard_async_op=True`` FSDP2 waits on the ``Work`` commpress hands it: the
    all-gather's error was lost there, and the forward ran on uninitialised parameters."""
    for unshard_async_op in (False, True):
        for outcome in run_distributed(_failing_all_gather, 2, unshard_async_op, timeout=60):
            assert outcome == "the all-gather failed", unshard_async_op


def _tuned_all_gathers(rank, world_size):
    from commpress.sim import tuner
    from commpress.transport import multicast

    tuner.configure(link="1gbit", algorithms=("native", "multicast"))
    # paces at which native wins either way: a multicast is never run on loopback
    multicast.configure(None, rate_bits=2 * 10**6)  # FSDP's group, the world's
    multicast.set_default_options(multicast.Options(rate_bits=10**6))  # the twin's
    timed_with = []
    choose = tuner.choose
    tuner.choose = lambda *args, **kwargs: (
        timed_with.append(kwargs["multicast"]) or choose(*args, **kwargs)
    )
    try:
        model = _model(False)
        compression = cp.fsdp.compress(model, all_gather="auto", reduce_scatter=None)
        _train(model, rank)
    finally:
        tuner.choose = choose
    fsdp_group = _torch_private.fsdp_param_groups(model[0])[0].process_groups[0]
    twin = compression.groups.twin(fsdp_group)
    return set(timed_with), multicast.options_of(twin), compression.all_gather.calls


def test_a_tuned_all_gather_is_timed_with_the_multicast_options_of_the_group_it_runs_on():
    """FSDP's all-gathers run on commpress's twin of FSDP's group, whose multicast has its
    own options: the tuner timed a multicast with those of FSDP's group."""
    from commpress.transport.reliable_broadcast import Options

    for timed_with, twin_options, calls in run_distributed(_tuned_all_gathers, 2, timeout=120):
        assert twin_options == Options(rate_bits=10**6)
        assert timed_with == {twin_options}
        assert calls > 0


def _tuner_settings_of_its_own(rank, world_size):
    import os

    if rank == 1:  # no algorithm that reduce-scatters: its check refuses "auto"
        os.environ["COMMPRESS_TUNE_ALGORITHMS"] = "multicast"
    try:
        cp.fsdp.compress(_model(False), all_gather="auto", reduce_scatter="auto")
    except ValueError as error:
        return str(error)
    return None


def test_a_rank_whose_checks_fail_alone_makes_every_rank_raise():
    """Rank 1 raised; rank 0 waited in the twins' set-up until rank 1's process ended
    ("Connection closed by peer"), or for the group's timeout while it lived on."""
    mine, theirs = run_distributed(_tuner_settings_of_its_own, 2, timeout=60)
    assert theirs.startswith("module '0' reduce-scatter: no algorithm of []")
    assert mine.startswith("cp.fsdp.compress failed on another rank, so on every rank (rank 1: ")
    assert theirs in mine


def _compress_with_a_stalled_peer(rank, world_size, directory):
    from datetime import timedelta

    from commpress.testing.stall import stall, timed_outcome

    model = _model(False)
    if rank == 1:
        stall(directory, (0, 2), 15.0)
        return None
    return timed_outcome(
        lambda: cp.fsdp.compress(model, timeout=timedelta(seconds=3)), directory, rank
    )


def test_compress_gives_up_on_a_peer_that_never_calls_it_within_its_timeout(tmp_path):
    """Its exchange of each rank's checks waited for the process group's timeout (30
    minutes by default), whatever ``timeout`` said."""
    results = run_distributed(_compress_with_a_stalled_peer, 3, str(tmp_path), timeout=60)
    for rank in (0, 2):
        kind, message, elapsed = results[rank]
        assert kind == "CollectiveTimeoutError", (kind, message)
        assert message.startswith(f"commpress fsdp.compress on 3 ranks (this is rank {rank}) "
                                  "timed out after 3.")  # fmt: skip
        assert 2.5 < elapsed < 13, elapsed


def _compressed_again(rank, world_size):
    """Each model compressed in turn (a notebook cell run again, a sweep), trained a step."""
    import gc

    twins, opened = [], []
    for _ in range(3):
        model = _model(prefetch=False)
        compression = cp.fsdp.compress(model, all_gather="int8", reduce_scatter="int8")
        twins.append(compression.groups.twin(dist.group.WORLD))
        _train(model, rank)
        opened.append(len(os.listdir("/proc/self/fd")))
        del model, compression
        gc.collect()
    alive = _model(prefetch=False)
    alive_twin = cp.fsdp.compress(alive).groups.twin(dist.group.WORLD)
    other_twin = cp.fsdp.compress(_model(prefetch=False)).groups.twin(dist.group.WORLD)
    return all(twin is twins[0] for twin in twins), opened, alive_twin is not other_twin


def test_compressing_model_after_model_reuses_the_twin_groups():
    """Each compress made new twins, never freed: 5 file descriptors and 3 threads more per
    call on gloo, for as long as the process lived, until it ran out of descriptors. The
    twins of a model gone are taken over; a live model's are its own."""
    for reused, opened, alive_apart in run_distributed(_compressed_again, 2, timeout=120):
        assert reused
        assert opened[0] == opened[-1], opened
        assert alive_apart, "two live models shared twins"


def _where_the_exchange_runs(rank, world_size):
    import contextlib
    import threading

    from commpress.integrations import groups

    seen = {}
    entered = []

    @contextlib.contextmanager
    def device(index):
        entered.append(index)
        yield

    def recorded(mine, group, timeout):
        seen["thread"] = threading.current_thread().name
        seen["device"] = entered[-1] if entered else None
        return [mine] * world_size

    groups.all_gather_objects = recorded
    groups.backends.moves = lambda group, device_type: None  # as an NCCL-only world
    torch.cuda.current_device = lambda: 3
    torch.cuda.device = device
    groups.exchange_with_every_rank("mine", None, "a test")
    return seen, threading.current_thread().name


def test_the_set_up_exchange_runs_after_queued_work_on_the_callers_gpu():
    """It ran on the calling thread, where it could reach the backend before a compressed
    collective given earlier on one rank and after it on another; on the communication
    thread it must enter the caller's GPU (that thread's own current one is cuda:0)."""
    (seen, caller), *_ = run_distributed(_where_the_exchange_runs, 1, timeout=60)
    assert seen["thread"] != caller, seen
    assert seen["device"] == torch.device("cuda", 3), seen


def _twins_of_a_group_with_a_short_timeout(rank, world_size, directory):
    from datetime import timedelta

    from commpress.testing.stall import stall, timed_outcome

    group = dist.new_group([0, 1], timeout=timedelta(seconds=2))
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer, mesh=cp.fsdp.cpu_mesh(group))
    fully_shard(model, mesh=cp.fsdp.cpu_mesh(group))
    cp.fsdp.compress(model)  # no timeout=: the group's
    if rank == 1:
        stall(directory, (0,), 15.0)
        return None
    return timed_outcome(lambda: model(torch.ones(4, 8)).sum().backward(), directory, rank)


def test_without_a_timeout_the_twins_wait_as_long_as_fsdps_group(tmp_path):
    """The twins were made by ``new_group`` without a timeout, so with torch's 30 minutes
    whatever FSDP's group had been given: a peer that stalled was waited for until it came
    back (2 s said, 15 s waited)."""
    kind, message, elapsed = run_distributed(
        _twins_of_a_group_with_a_short_timeout, 2, str(tmp_path), timeout=60
    )[0]
    assert kind == "CollectiveTimeoutError", message
    assert "(the process group's timeout)" in message, message
    assert 1.5 < elapsed < 8, (elapsed, message)


def _native_with_a_stalled_peer(rank, world_size, where, directory):
    from datetime import timedelta

    from commpress.testing.stall import stall, timed_outcome

    model = _model(False)
    cp.fsdp.compress(model, "none@native", "none@native", timeout=timedelta(seconds=2))
    wait_native = fsdp_integration._wait_native

    def late(*args):  # the communication thread starts its wait late (a loaded machine)
        time.sleep(0.3)
        return wait_native(*args)

    fsdp_integration._wait_native = late
    if rank == 1:
        if where == "backward":  # inside its first reduce-scatter, before torch's starts
            scatter = fsdp_integration.CompressedReduceScatter.__call__

            def stalled(*args, **kwargs):
                stall(directory, (0,), 15.0)
                return scatter(*args, **kwargs)

            fsdp_integration.CompressedReduceScatter.__call__ = stalled
        else:
            stall(directory, (0,), 15.0)
            return None
    step = lambda: F.cross_entropy(model(torch.ones(8, 32)), torch.zeros(8).long()).backward()  # noqa: E731
    outcome = timed_outcome(step, directory, rank)
    return outcome if rank == 0 else None


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_native_collective_gives_up_within_compress_timeout(where, tmp_path):
    """``native`` ran torch's collective on FSDP's own group and waited for it without a
    timeout: a stalled peer was waited for as long as that group's timeout (the world's,
    30 minutes by default), whatever ``compress(timeout=)`` said; and its error was
    torch's bare one. The seconds it says count from the collective's issue, gloo's clock, not from
    the communication thread's wait (it said "1.7 s" when that wait started late)."""
    kind, message, elapsed = run_distributed(
        _native_with_a_stalled_peer, 2, where, str(tmp_path), timeout=60
    )[0]
    assert kind == "CollectiveTimeoutError", message
    assert "(none@native) on a group of 2 ranks (this is rank 0) timed out after 2." in message
    assert 1.5 < elapsed < 8, (elapsed, message)


def _compressed_on_one_rank_alone(rank, world_size, directory):
    """Rank 0 compresses (a rank-0-only branch); rank 1 trains with FSDP2's own collectives
    on the world, which it gives a short timeout of its own."""
    from datetime import timedelta

    from commpress.testing.stall import timed_outcome

    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer, mesh=cp.fsdp.cpu_mesh())
    fully_shard(model, mesh=cp.fsdp.cpu_mesh())
    if rank == 0:
        call = lambda: cp.fsdp.compress(model, timeout=timedelta(seconds=3))  # noqa: E731
    else:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=6), None)
        call = lambda: model(torch.ones(4, 8)).sum().backward()  # noqa: E731
    return timed_outcome(call, directory, rank)


def test_compress_called_on_one_rank_alone_raises_there_and_kills_no_process(tmp_path):
    """Its set-up exchange (two all-gathers on the world) met the peer's FSDP2 all-gather of
    parameters, and gloo ended the compressing rank's process (``op.preamble.length <=
    op.nbytes``). The exchange now travels by point-to-point messages of a tag of its own,
    which gloo never matches with a collective: it times out, naming compress."""
    from commpress.cluster.local import DistributedError

    try:
        results = run_distributed(_compressed_on_one_rank_alone, 2, str(tmp_path), timeout=60)
    except DistributedError as error:
        assert "died" not in str(error), f"a rank's process was killed: {error}"
        raise
    kind, message, elapsed = results[0]
    assert kind == "CollectiveTimeoutError", (kind, message)
    assert message.startswith("commpress fsdp.compress on 2 ranks (this is rank 0) timed out"), (
        message
    )
    assert "every rank must call" in message, message
    assert 2.5 < elapsed < 13, elapsed
    assert results[1][0] != "no error", results[1]
