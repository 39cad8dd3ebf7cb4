"""CUDA tensors on a gloo group, two ranks sharing the one GPU (NCCL refuses two ranks on
one device): every hop runs, its messages staged through host memory by the transport
(gloo's sends and receives take host memory only; a device address aborted the process
before: ``benchmarks/gpu_2026-11-27/README.md``). Each result is checked against the same
commpress call on CPU copies of the inputs in the same processes: bit for bit where the
codec is lossless or the output is gathered payloads decoded on the GPU, and within
rounding of the CPU's where sums of decoded values differ (CUDA's decode rounds
``q / qmax`` differently in the last bit: see the benchmark's README)."""

from __future__ import annotations

import pytest
import torch

import commpress as cp
from commpress.bench.collectives import output_for, run_collective
from commpress.cluster.local import run_distributed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHARD = 40_000
OPS = {
    "ring": ("all_gather", "reduce_scatter", "all_reduce", "reduce_scatter_in_pieces"),
    "ring-hop": ("all_gather", "reduce_scatter", "all_reduce"),
    "alltoall": ("reduce_scatter", "all_reduce", "reduce_scatter_in_pieces"),
    "backend": ("all_gather", "reduce_scatter", "all_reduce"),
}
SPECS = ("none", "int8", "int4")
#: A reduction cut into several pieces of this many fp32 bytes (two in flight for
#: ``alltoall``), where the default pieces hold a shard of SHARD whole.
SMALL_PIECES = 16 << 10


def _inputs(op: str, world_size: int) -> list[torch.Tensor]:
    numel = SHARD if op == "all_gather" else SHARD * world_size
    generator = torch.Generator().manual_seed(11)
    return [torch.randn(numel, generator=generator) for _ in range(world_size)]


def _call(op: str, inp: torch.Tensor, world_size: int, spec: str, algorithm: str):
    collective = "reduce_scatter" if op == "reduce_scatter_in_pieces" else op
    out = output_for(collective, inp, world_size).fill_(float("nan"))  # every element written
    if op == "reduce_scatter_in_pieces":
        cp.reduce_scatter_tensor(
            out, inp, codec=spec, algorithm=algorithm, chunk_bytes=SMALL_PIECES
        )
    else:
        run_collective(op, algorithm, spec, inp, out)
    return out


def _gathered_on_gpu(spec: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    """What an all-gather must hold: each shard encoded and decoded on the GPU."""
    codec = cp.get_codec(spec)
    return torch.cat([codec.decode(codec.encode(x.cuda()), x.numel(), x.dtype) for x in inputs])


def _on_gpu_and_cpu(rank, world_size, algorithm):
    torch.cuda.set_device(0)
    results = {}
    for op in OPS[algorithm]:
        for spec in SPECS:
            inputs = _inputs(op, world_size)
            on_gpu = _call(op, inputs[rank].cuda(), world_size, spec, algorithm)
            assert on_gpu.is_cuda
            on_cpu = _call(op, inputs[rank], world_size, spec, algorithm)
            expected = _gathered_on_gpu(spec, inputs).cpu() if op == "all_gather" else None
            results[op, spec] = (on_gpu.cpu(), on_cpu, expected)
    return results


@pytest.mark.parametrize("algorithm", list(OPS))
def test_cuda_tensors_on_gloo_match_the_cpu_run(algorithm):
    ranks = run_distributed(_on_gpu_and_cpu, 2, algorithm, backend="gloo", timeout=240)
    for rank, results in enumerate(ranks):
        for (op, spec), (on_gpu, on_cpu, expected) in results.items():
            case = (rank, op, spec)
            assert not on_gpu.isnan().any(), case  # every element written
            if op == "all_gather":
                assert torch.equal(on_gpu, expected), case
                assert torch.equal(on_gpu, ranks[0][op, spec][0]), case  # same on every rank
            elif spec == "none":
                assert torch.equal(on_gpu, on_cpu), case
            else:  # last-bit differences of the decode, summed: far below the codec's error
                scale = on_cpu.abs().max()
                assert (on_gpu - on_cpu).abs().max() <= 1e-5 * scale, case


def _native_through_the_fsdp_adapters(rank, world_size):
    """FSDP2's custom collectives with ``none@native`` (torch's own) on CUDA tensors: gloo
    moves them, and gloo's reduce-scatter Work has no future (the adapters took every
    CUDA ``native`` Work for NCCL's, whose future they chain on)."""
    import torch.distributed as dist

    from commpress.collectives import ALL_GATHER_ALGORITHMS, REDUCE_SCATTER_ALGORITHMS
    from commpress.integrations import fsdp
    from commpress.integrations.groups import OwnGroups
    from commpress.integrations.spec import CollectiveSpec
    from commpress.integrations.stats import CommStats

    torch.cuda.set_device(0)
    world = dist.group.WORLD
    own = OwnGroups([world])
    gather_spec = CollectiveSpec.parse(
        "none@native", ALL_GATHER_ALGORITHMS, "all_gather", gathers=True
    )
    scatter_spec = CollectiveSpec.parse(
        "none@native", REDUCE_SCATTER_ALGORITHMS, "reduce_scatter", gathers=False
    )
    gather = fsdp.CompressedAllGather(gather_spec, CommStats(), None, "m", own)
    scatter = fsdp.CompressedReduceScatter(scatter_spec, CommStats(), None, "m", False, own)
    shard = _inputs("all_gather", world_size)[rank].cuda()
    full = _inputs("reduce_scatter", world_size)[rank].cuda()
    results = {}
    for async_op in (False, True):
        out = torch.full((world_size * SHARD,), float("nan"), device="cuda")
        work = gather(out, shard, world, async_op=async_op)
        if async_op:
            work.wait()
        results["all_gather", async_op] = out.cpu()  # read on the caller's stream
    part = torch.full((SHARD,), float("nan"), device="cuda")
    scatter(part, full, world, dist.ReduceOp.SUM)
    results["reduce_scatter", False] = part.cpu()
    return results


def test_torch_own_collectives_through_the_fsdp_adapters_on_gloo():
    world_size = 2
    ranks = run_distributed(_native_through_the_fsdp_adapters, world_size, backend="gloo",
                            timeout=240)  # fmt: skip
    gathered = torch.cat(_inputs("all_gather", world_size))
    summed = torch.stack(_inputs("reduce_scatter", world_size)).sum(0)
    for rank, results in enumerate(ranks):
        assert torch.equal(results["all_gather", False], gathered), rank
        assert torch.equal(results["all_gather", True], gathered), rank
        expected = summed[rank * SHARD : (rank + 1) * SHARD]
        assert torch.equal(results["reduce_scatter", False], expected), rank  # a + b, once
