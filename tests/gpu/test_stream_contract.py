"""The CUDA stream contract of the compressed collectives and of the FSDP2/DDP adapters.

Like torch.distributed: a collective is ordered after the work already queued on the
caller's current stream, and after ``wait()`` (or the future handed to FSDP2/DDP) its
output is safe to use on the caller's current stream. Each test queues a long kernel
(``torch.cuda._sleep``) before the producer writes the input, and reads the output on
the caller's stream right after ``wait()`` without any synchronisation: a collective that
read its input early, or a consumer that was not made to wait, sees stale data.

One GPU allows a one-rank NCCL job, which still runs every stream hand-over (the
communication thread encodes, decodes and copies on its own stream).
"""

from __future__ import annotations

import pytest
import torch

import commpress as cp
from commpress._torch_private import cuda_sleep
from commpress.testing.distributed import run_distributed

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


def _fsdp(rank, world_size, spec):
    from torch.distributed.fsdp import fully_shard

    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8)).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    if spec is not None:
        cp.fsdp.compress(model, all_gather=spec, reduce_scatter=spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(32, 256, generator=torch.Generator().manual_seed(step)).cuda()
        cuda_sleep(SLEEP_CYCLES // 4)  # keep the producer busy around FSDP's copy-in
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.full_tensor().detach().cpu() for p in model.parameters()]


def test_fsdp2_with_lossless_compression_equals_plain_fsdp2_on_cuda():
    plain = run_distributed(_fsdp, 1, None, backend="nccl", timeout=180)[0]
    compressed = run_distributed(_fsdp, 1, "none", backend="nccl", timeout=180)[0]
    assert all(torch.equal(a, b) for a, b in zip(plain, compressed, strict=True))


def _ddp(rank, world_size, spec):
    from torch.nn.parallel import DistributedDataParallel

    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8)).cuda()
    ddp = DistributedDataParallel(model, device_ids=[0])
    if spec is not None:
        ddp.register_comm_hook(*cp.ddp.hook(spec))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(32, 256, generator=torch.Generator().manual_seed(step)).cuda()
        cuda_sleep(SLEEP_CYCLES // 4)
        ddp(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


def test_ddp_hook_with_lossless_compression_equals_plain_ddp_on_cuda():
    plain = run_distributed(_ddp, 1, None, backend="nccl", timeout=180)[0]
    compressed = run_distributed(_ddp, 1, "none", backend="nccl", timeout=180)[0]
    assert all(torch.equal(a, b) for a, b in zip(plain, compressed, strict=True))


def test_a_deliberately_unordered_collective_is_caught():
    """The check above can fail: without the stream hand-over the consumer sees stale data."""
    assert not run_distributed(_unordered, 1, backend="nccl", timeout=180)[0]


def _unordered(rank, world_size):
    from commpress.collectives import work

    work.StreamOrder.make_current_stream_wait = lambda self: None  # break the contract
    original = work.StreamOrder.on_comm_stream

    def no_wait(self):
        self.ready = torch.cuda.Event()  # a fresh event: nothing to wait for
        self.ready.record(self.stream)
        return original(self)

    work.StreamOrder.on_comm_stream = no_wait
    return _ordered(rank, world_size, "all_gather", "int8", "ring", False)
