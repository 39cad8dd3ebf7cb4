"""The CUDA stream contract of the compressed collectives and of the FSDP2/DDP adapters.

Like torch.distributed: a collective is ordered after the work already queued on the
caller's current stream, and after ``wait()`` (or the future handed to FSDP2/DDP) its
output is safe to use on the caller's current stream. Each check keeps one side busy
with a long kernel (``torch.cuda._sleep``): the producer, before it writes the input (a
collective that read its input early sees zeros), or the communication stream, before
it encodes (a consumer that was not made to wait reads the output before it is written).
The collective runs once before, so that no compilation on the communication thread
outlasts the sleep and hides a missing hand-over.

One GPU allows a one-rank NCCL job. It runs every stream hand-over (the communication
thread encodes, decodes and copies on its own stream) but no hop. Two ranks share the GPU
on a gloo group (NCCL refuses two ranks on one device): their hops run, staged through
host memory; there the consumer's side is checked with the decodes slowed instead (a
sleep queued once each message is in), since the staging's blocking copy of each send
would absorb a sleep queued before the collective's work. NCCL point-to-point from the
communication thread, the fingerprint exchange on NCCL and the twin process groups need
two GPUs and are not covered here.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress._torch_private import cuda_sleep
from commpress.cluster.local import run_distributed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

NUMEL = 1 << 20
SLEEP_CYCLES = 2_000_000_000  # about a second on a 1.5-2 GHz GPU clock
SPECS = [("none", "ring"), ("int8", "ring"), ("int8", "ring-hop"), ("int4", "ring")]


def _values(seed: int = 0) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(seed)).cuda()


def _slow_communication_stream() -> None:
    """From now on, the communication stream sleeps before each collective's work."""
    from commpress.collectives import work

    original = work.StreamOrder.on_comm_stream

    @contextlib.contextmanager
    def slowed(self):
        with original(self):
            cuda_sleep(SLEEP_CYCLES)  # on the communication stream
            yield

    work.StreamOrder.on_comm_stream = slowed


def _produce_collect_consume(
    issue, slow: str, out_numel: int = NUMEL, values: torch.Tensor | None = None
) -> torch.Tensor:
    """Fill the input with ``values`` (after a sleep if the producer is slow), run
    ``issue(inp, out)`` to its ``wait()``, and read the output on the same stream at once;
    the copy it read."""
    if values is None:
        values = _values()  # before the sleep: a copy from host memory would wait it out
    inp = torch.zeros(NUMEL, device="cuda")
    out = torch.full((out_numel,), -1.0, device="cuda")
    if slow == "producer":
        cuda_sleep(SLEEP_CYCLES)  # the producer is still busy when the collective is issued
    inp.copy_(values)
    out = issue(inp, out)
    seen = out.clone()  # the consumer, on the caller's stream, without synchronising
    torch.cuda.synchronize()
    return seen.cpu()


def _verdict(seen: torch.Tensor, expected: torch.Tensor) -> tuple[bool, str]:
    """Whether ``seen`` is right, and what it holds where it is not (for the failure)."""
    expected = expected.cpu()
    wrong = seen != expected
    unwritten = int((seen[wrong] == -1.0).sum())
    return not bool(wrong.any()), f"{int(wrong.sum())} wrong, {unwritten} of them unwritten"


def _collective(op, spec, algorithm):
    def issue(inp, out):
        if op == "all_gather":
            cp.all_gather_into_tensor(
                out, inp, codec=spec, algorithm=algorithm, async_op=True
            ).wait()
        elif op == "reduce_scatter":
            cp.reduce_scatter_tensor(
                out, inp, codec=spec, algorithm=algorithm, async_op=True
            ).wait()
        else:
            cp.all_reduce(inp, codec=spec, algorithm=algorithm, async_op=True).wait()
            return inp
        return out

    return issue


def _round_trip(spec: str) -> torch.Tensor:
    """What a rank that gathers the values through ``spec`` ends with."""
    codec, values = cp.get_codec(spec), _values()
    return codec.decode(codec.encode(values), NUMEL, values.dtype)


def _unhurried_then_hurried(issue, expected: torch.Tensor, slow: str):
    """The verdicts of a first run with nobody slow (no compilation is left for the second
    to wait on) and of a second with ``slow`` ("producer" or "communication") slow."""
    size = expected.numel()
    unhurried = _verdict(_produce_collect_consume(issue, "none", size), expected)
    if slow == "communication":
        _slow_communication_stream()
    return unhurried, _verdict(_produce_collect_consume(issue, slow, size), expected)


def _ordered(rank, world_size, op, spec, algorithm, side_stream, slow):
    torch.cuda.set_device(0)
    # One rank: a reduce-scatter encodes nothing, its own chunk is added exactly.
    expected = _values() if op == "reduce_scatter" else _round_trip(spec)
    issue = _collective(op, spec, algorithm)
    caller = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(caller):
        return _unhurried_then_hurried(issue, expected, slow)


def _check(results) -> None:
    (warm_ok, warm_detail), (ok, detail) = results[0]
    assert warm_ok, f"unhurried run: {warm_detail}"
    assert ok, detail


@pytest.mark.parametrize(
    ("side_stream", "slow"),
    [(False, "producer"), (True, "producer"), (False, "communication")],
)
@pytest.mark.parametrize(("spec", "algorithm"), SPECS)
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
def test_collective_waits_for_the_producer_and_the_consumer_waits_for_it(
    op, spec, algorithm, side_stream, slow
):
    if (op, spec) == ("all_reduce", "none"):
        # In place at one rank, `none` leaves the tensor as it found it: an early read or
        # an early consumer would see the right values, so this case could not fail.
        pytest.skip("cannot fail: a one-rank all-reduce with `none` changes nothing")
    args = (op, spec, algorithm, side_stream, slow)
    _check(run_distributed(_ordered, 1, *args, backend="nccl", timeout=180))


def _adapter(which):
    """FSDP2's custom collectives and the DDP hook, called as FSDP2 and DDP call them (FSDP2
    itself skips its collectives at world size 1, so a one-rank FSDP2 run would test
    nothing): an all-gather synchronously, FSDP2's default, where only the future it waits
    on orders the caller's stream, or with ``async_op=True`` (``unshard_async_op``) and
    ``wait()``; a reduce-scatter synchronously, as FSDP2 always calls it. ``issue(inp,
    out)`` returns what the consumer reads."""
    from commpress.collectives import ALL_GATHER_ALGORITHMS, REDUCE_SCATTER_ALGORITHMS
    from commpress.integrations import ddp, fsdp
    from commpress.integrations.groups import OwnGroups
    from commpress.integrations.spec import CollectiveSpec
    from commpress.integrations.stats import CommStats

    world = dist.group.WORLD
    if which in ("fsdp_all_gather", "fsdp_all_gather_async"):
        spec = CollectiveSpec.parse("int8", ALL_GATHER_ALGORITHMS, "all_gather", gathers=True)
        gather = fsdp.CompressedAllGather(spec, CommStats(), None, "m", OwnGroups([world]))
        asynchronously = which == "fsdp_all_gather_async"

        def issue(inp, out):
            work = gather(out, inp, world, async_op=asynchronously)
            if asynchronously:
                work.wait()
            return out

    elif which == "fsdp_reduce_scatter":
        spec = CollectiveSpec.parse(
            "int8", REDUCE_SCATTER_ALGORITHMS, "reduce_scatter", gathers=False
        )
        scatter = fsdp.CompressedReduceScatter(
            spec, CommStats(), None, "m", False, OwnGroups([world])
        )

        def issue(inp, out):
            scatter(out, inp, world, dist.ReduceOp.AVG)
            return out

    else:
        state, hook = ddp.hook("int8", group=world)

        def issue(inp, out):
            class Bucket:
                def buffer(self):
                    return inp

            return hook(state, Bucket()).wait()  # DDP's stream waits on the future like this

    return issue


def _adapters(rank, world_size, which, slow):
    torch.cuda.set_device(0)
    # One rank: its own contribution to a reduce-scatter is never encoded.
    expected = _values() if which == "fsdp_reduce_scatter" else _round_trip("int8")
    return _unhurried_then_hurried(_adapter(which), expected, slow)


@pytest.mark.parametrize("slow", ["producer", "communication"])
@pytest.mark.parametrize(
    "which", ["fsdp_all_gather", "fsdp_all_gather_async", "fsdp_reduce_scatter", "ddp_hook"]
)
def test_fsdp_and_ddp_adapters_keep_the_stream_contract(which, slow):
    _check(run_distributed(_adapters, 1, which, slow, backend="nccl", timeout=180))


def _slow_received_payloads() -> None:
    """From now on, the communication stream sleeps once each received message is in, so
    the decodes that follow (the last writes of ``out``) finish a second late."""
    from commpress.transport import p2p

    for kind in (p2p.Batch, p2p.Pending):  # point-to-point messages; backend collectives
        original = kind.wait

        def slowed(self, timeout=None, original=original):
            original(self, timeout)
            cuda_sleep(SLEEP_CYCLES)  # on the current stream: the communication stream

        kind.wait = slowed


def _remove_half(broken: str | None) -> None:
    """Remove one half of the stream hand-over (the tests that show the checks can fail)."""
    from commpress.collectives import work

    if broken == "consumer":
        work.StreamOrder.make_current_stream_wait = lambda self: None
    elif broken == "producer":
        original = work.StreamOrder.on_comm_stream

        def no_wait(self):
            self.ready = torch.cuda.Event()  # recorded on the comm stream: nothing to wait for
            self.ready.record(self.stream)
            return original(self)

        work.StreamOrder.on_comm_stream = no_wait


def _two_ranks_on_gloo(rank, world_size, spec, algorithm, slow, broken=None):
    """Verdicts of an unhurried all-gather and of one with ``slow`` ("producer" or "decode")
    slow, each rank's shard its own and new on each run, so that no stale buffer holds
    the right answer."""
    torch.cuda.set_device(0)
    issue = _collective("all_gather", spec, algorithm)
    codec = cp.get_codec(spec)
    verdicts = []
    for run, who in enumerate(("none", slow)):
        shards = [_values(seed=100 * run + r) for r in range(world_size)]
        expected = torch.cat([codec.decode(codec.encode(x), NUMEL, x.dtype) for x in shards])
        if who == "decode":
            _slow_received_payloads()
        if run == 1:
            _remove_half(broken)
        seen = _produce_collect_consume(issue, who, NUMEL * world_size, shards[rank])
        verdicts.append(_verdict(seen, expected))
    return verdicts


TWO_RANK_CASES = [("int8", "ring"), ("int8", "backend"), ("none", "ring")]


@pytest.mark.parametrize("slow", ["producer", "decode"])
@pytest.mark.parametrize(("spec", "algorithm"), TWO_RANK_CASES)
def test_two_ranks_on_gloo_keep_the_stream_contract(spec, algorithm, slow):
    """With a hop: two ranks share the GPU on a gloo group (messages staged through host
    memory), each its producer, or the decodes after each received message, slow."""
    results = run_distributed(
        _two_ranks_on_gloo, 2, spec, algorithm, slow, backend="gloo", timeout=180
    )
    for verdicts in results:
        _check([verdicts])


@pytest.mark.parametrize(("broken", "slow"), [("producer", "producer"), ("consumer", "decode")])
def test_a_hop_with_half_the_hand_over_removed_is_caught(broken, slow):
    """The two-rank check can fail: without the producer half the encode reads the input
    before it is written; without the consumer half the caller reads ``out`` before the
    slow decodes have written it."""
    results = run_distributed(
        _two_ranks_on_gloo, 2, "int8", "ring", slow, broken, backend="gloo", timeout=180
    )
    for (warm_ok, warm_detail), (ok, detail) in results:
        assert warm_ok, f"unhurried run: {warm_detail}"
        assert not ok, f"the {broken} half removed, yet the check passed ({detail})"


@pytest.mark.parametrize("side_stream", [False, True])
@pytest.mark.parametrize("broken", ["producer", "consumer"])
def test_a_deliberately_unordered_collective_is_caught(broken, side_stream):
    """The check above can fail: with either half of the hand-over removed, the collective
    reads the input too early or the consumer reads the output too early."""
    args = (broken, side_stream)
    _, (ok, detail) = run_distributed(_unordered, 1, *args, backend="nccl", timeout=180)[0]
    assert not ok, f"the {broken} half removed, yet the check passed ({detail})"


def _unordered(rank, world_size, broken, side_stream):
    _remove_half(broken)
    slow = "communication" if broken == "consumer" else "producer"
    return _ordered(rank, world_size, "all_gather", "int8", "ring", side_stream, slow)


@pytest.mark.parametrize("which", ["fsdp_all_gather", "fsdp_reduce_scatter", "ddp_hook"])
def test_a_future_that_orders_no_stream_is_caught(which):
    """The adapters' check can fail too: with the future FSDP2 and DDP wait on completed
    as a plain CPU future (what the FSDP2 adapter amounted to before the GPU session), the
    consumer reads the output before the slow communication stream has written it. FSDP2's
    synchronous calls only: with ``async_op=True`` FSDP2 waits on the collective's handle,
    which orders the stream itself (``FutureWork.wait``), whatever the future."""
    _, (ok, detail) = run_distributed(_futures_unordered, 1, which, backend="nccl", timeout=180)[0]
    assert not ok, f"a future without CUDA events, yet the check passed ({detail})"


def _futures_unordered(rank, world_size, which):
    from commpress.collectives import work

    def cpu_future(self, value, before=None):
        future = torch.futures.Future()  # no devices: waiting orders no stream

        def complete(done):
            if before is not None:
                before()
            future.set_result(value)

        self._future.add_done_callback(complete)
        return future

    work.CollectiveWork.torch_future = cpu_future
    return _adapters(rank, world_size, which, "communication")


class _Bucket:
    """What DDP hands a comm hook: one parameter whose gradient is the whole buffer."""

    def __init__(self, parameter: torch.Tensor, buffer: torch.Tensor):
        self._parameter, self._buffer = parameter, buffer

    def parameters(self):
        return [self._parameter]

    def gradients(self):
        return [self._buffer.view_as(self._parameter)]

    def buffer(self):
        return self._buffer

    def is_last(self):
        return True


def _lowrank_hooks(rank, world_size, broken=False):
    """The low-rank scheduler's result on a bucket its producer is still writing (a slow
    kernel queued before the write), read on the caller's stream right after the future,
    against the serial hook's on the same values (which runs on the caller's stream).
    ``broken``: the scheduler's stream does not wait for the bucket's writer."""
    from commpress.lowrank import hook as lowrank_hook

    torch.cuda.set_device(0)
    if broken:
        lowrank_hook.Pipeline.side_stream = _side_stream_without_wait
    parameter = torch.zeros(1024, 1024, device="cuda")
    values = _values()
    seen = {}
    for scheduler in (False, True, True):  # the first scheduled run compiles nothing late
        state, hook = cp.lowrank.ddp_hook(
            "powersgd:rank=4,start_iter=0,warm_start=false", scheduler=scheduler
        )
        buffer = torch.zeros(NUMEL, device="cuda")
        cuda_sleep(SLEEP_CYCLES)
        buffer.copy_(values)
        result = hook(state, _Bucket(parameter, buffer)).wait()
        seen[scheduler] = result.clone()  # on the caller's stream, without synchronising
        torch.cuda.synchronize()
    return _verdict(seen[True].cpu(), seen[False])


@contextlib.contextmanager
def _side_stream_without_wait(self, written):
    if self.stream is None:
        self.stream = torch.cuda.Stream()
    with torch.cuda.stream(self.stream):
        yield


def test_the_lowrank_scheduler_waits_for_the_bucket_and_its_future_for_it():
    ok, detail = run_distributed(_lowrank_hooks, 1, backend="nccl", timeout=180)[0]
    assert ok, detail


def test_a_lowrank_scheduler_that_does_not_wait_for_the_bucket_is_caught():
    ok, detail = run_distributed(_lowrank_hooks, 1, True, backend="nccl", timeout=180)[0]
    assert not ok, f"the scheduler ignored the bucket's writer, yet the check passed ({detail})"


def _freed_state_reused(rank, world_size, broken=False):
    """Whether the memory of a state tensor that ``load_state_dict`` cloned (on the default
    stream) is handed back to the default stream while a side stream that planned a part
    from it is still busy: the scheduler's case, where backward would then overwrite
    factors and error buffers before the side stream read them. ``broken``: the reducer
    does not record the side stream's use."""
    from commpress.lowrank.reducer import Reducer

    torch.cuda.set_device(0)
    reducer = Reducer("powersgd:rank=4,start_iter=0")
    gradient = torch.randn(512, 256, device="cuda")
    reducer.reduce([("w", gradient)])
    saved = reducer.state_dict()
    reducer.load_state_dict(saved)  # clones on the default stream
    if broken:
        reducer._adopt_loaded = lambda: None
    loaded = reducer.states["w"]["error"]
    address, size = loaded.data_ptr(), loaded.numel()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        cuda_sleep(SLEEP_CYCLES)  # the side stream's reads are still to come
        reducer.plan([("w", gradient)])
    del loaded
    reducer.states.clear()  # the step's write-back drops the loaded tensors likewise
    taken = [torch.empty(size, device="cuda") for _ in range(8)]  # other free blocks first
    reused = any(tensor.data_ptr() == address for tensor in taken)
    torch.cuda.synchronize()
    return reused


def test_states_loaded_from_a_checkpoint_stay_allocated_until_the_side_stream_read_them():
    assert not run_distributed(_freed_state_reused, 1, backend="nccl", timeout=180)[0]


def test_a_reducer_that_does_not_record_the_side_stream_is_caught():
    assert run_distributed(_freed_state_reused, 1, True, backend="nccl", timeout=180)[0]
