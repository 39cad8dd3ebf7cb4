"""The CUDA stream contract of the compressed collectives and of the FSDP2/DDP adapters.

Like torch.distributed: a collective is ordered after the work already queued on the
caller's current stream, and after ``wait()`` (or the future handed to FSDP2/DDP) its
output is safe to use on the caller's current stream. Each test queues a long kernel
(``torch.cuda._sleep``) before the producer writes the input, and reads the output on
the caller's stream right after ``wait()`` without any synchronisation: a collective that
read its input early, or a consumer that was not made to wait, sees stale data.

One GPU allows a one-rank NCCL job. It runs every stream hand-over (the communication
thread encodes, decodes and copies on its own stream) but no hop: NCCL point-to-point
from the communication thread, the fingerprint exchange and the twin process groups
need two GPUs and are not covered here.
"""

from __future__ import annotations

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


def _values() -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(0)).cuda()


def _ordered(rank, world_size, op, spec, algorithm, side_stream):
    torch.cuda.set_device(0)
    codec = cp.get_codec(spec)
    values = _values()
    expected = codec.decode(codec.encode(values), NUMEL, values.dtype)
    torch.cuda.synchronize()
    caller = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(caller):
        inp = torch.zeros(NUMEL, device="cuda")
        out = torch.full((NUMEL,), -1.0, device="cuda")
        cuda_sleep(SLEEP_CYCLES)  # the producer is still busy when the collective is issued
        inp.copy_(values)
        if op == "all_gather":
            work = cp.all_gather_into_tensor(
                out, inp, codec=spec, algorithm=algorithm, async_op=True
            )
        elif op == "reduce_scatter":
            work = cp.reduce_scatter_tensor(
                out, inp, codec=spec, algorithm=algorithm, async_op=True
            )
        else:
            out = inp
            work = cp.all_reduce(out, codec=spec, algorithm=algorithm, async_op=True)
        work.wait()
        seen = out.clone()  # the consumer, on the caller's stream, without synchronising
    torch.cuda.synchronize()
    if op == "reduce_scatter" and not codec.lossless:
        expected = values  # one rank: nothing is encoded, its own chunk is added exactly
    if op == "all_reduce" and not codec.lossless:
        expected = codec.decode(codec.encode(values), NUMEL, values.dtype)
    return torch.equal(seen.cpu(), expected.cpu())


@pytest.mark.parametrize("side_stream", [False, True])
@pytest.mark.parametrize(("spec", "algorithm"), SPECS)
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
def test_collective_waits_for_the_producer_and_the_consumer_waits_for_it(
    op, spec, algorithm, side_stream
):
    args = (op, spec, algorithm, side_stream)
    assert run_distributed(_ordered, 1, *args, backend="nccl", timeout=180)[0]


def _adapters(rank, world_size, which):
    """FSDP2's custom collectives and the DDP hook, called as FSDP2 and DDP call them (FSDP2
    itself skips its collectives at world size 1, so a one-rank FSDP2 run would test
    nothing): the producer still busy at the call, the consumer right after the wait."""
    from commpress.collectives import ALL_GATHER_ALGORITHMS, REDUCE_SCATTER_ALGORITHMS
    from commpress.integrations import ddp, fsdp
    from commpress.integrations.groups import OwnGroups
    from commpress.integrations.spec import CollectiveSpec
    from commpress.integrations.stats import CommStats

    torch.cuda.set_device(0)
    world = dist.group.WORLD
    codec = cp.get_codec("int8")
    values = _values()
    expected = codec.decode(codec.encode(values), NUMEL, values.dtype)
    torch.cuda.synchronize()
    inp = torch.zeros(NUMEL, device="cuda")
    out = torch.full((NUMEL,), -1.0, device="cuda")
    cuda_sleep(SLEEP_CYCLES)
    inp.copy_(values)
    if which == "fsdp_all_gather":
        spec = CollectiveSpec.parse("int8", ALL_GATHER_ALGORITHMS, "all_gather", gathers=True)
        gather = fsdp.CompressedAllGather(spec, CommStats(), None, "m", OwnGroups([world]))
        gather(out, inp, world, async_op=True).wait()
    elif which == "fsdp_reduce_scatter":
        spec = CollectiveSpec.parse(
            "int8", REDUCE_SCATTER_ALGORITHMS, "reduce_scatter", gathers=False
        )
        scatter = fsdp.CompressedReduceScatter(
            spec, CommStats(), None, "m", False, OwnGroups([world])
        )
        scatter(out, inp, world, dist.ReduceOp.AVG, async_op=True).wait()
        expected = values  # one rank: its own contribution is never encoded
    else:
        state, hook = ddp.hook("int8", group=world)

        class Bucket:
            def buffer(self):
                return inp

        out = hook(state, Bucket()).wait()  # DDP's stream waits on the future like this
    seen = out.clone()
    torch.cuda.synchronize()
    return torch.equal(seen.cpu(), expected.cpu())


@pytest.mark.parametrize("which", ["fsdp_all_gather", "fsdp_reduce_scatter", "ddp_hook"])
def test_fsdp_and_ddp_adapters_keep_the_stream_contract(which):
    assert run_distributed(_adapters, 1, which, backend="nccl", timeout=180)[0]


@pytest.mark.parametrize("broken", ["producer", "consumer"])
def test_a_deliberately_unordered_collective_is_caught(broken):
    """The check above can fail: with either half of the hand-over removed, the collective
    reads the input too early or the consumer reads the output too early."""
    assert not run_distributed(_unordered, 1, broken, backend="nccl", timeout=180)[0]


def _unordered(rank, world_size, broken):
    from commpress.collectives import work

    if broken == "consumer":
        work.StreamOrder.make_current_stream_wait = lambda self: None
    else:
        original = work.StreamOrder.on_comm_stream

        def no_wait(self):
            self.ready = torch.cuda.Event()  # recorded on the comm stream: nothing to wait for
            self.ready.record(self.stream)
            return original(self)

        work.StreamOrder.on_comm_stream = no_wait
    return _ordered(rank, world_size, "all_gather", "int8", "ring", False)
