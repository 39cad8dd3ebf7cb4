"""Fixed inputs and the cases whose outputs must stay bitwise the same across refactors.

``python tests/distributed/golden.py`` writes the SHA-256 of every rank's output of every
case to ``data/golden_outputs.json``; ``test_golden.py`` recomputes and compares them.
The file was written by the collectives as they were before the single executor (commit
75a6e3a), so the test shows that the executor changed no bit of any result. The digests of
the stochastic cases were rewritten when stochastic rounding's streams came to be seeded by
the codec's kind and block too (every other digest left as it was, and unchanged).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import commpress as cp

GOLDEN = Path(__file__).with_name("data") / "golden_outputs.json"
WORLD_SIZES = (1, 2, 3, 4)
CODECS = ("none", "int8", "int4", "fp8", "bf16", "int8:stochastic=1")
ALL_GATHER = ("ring", "ring-hop")
REDUCTIONS = ("ring", "ring-hop", "alltoall")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Reductions run with SUM; with AVG too for these codecs (the division happens in fp32).
AVERAGED = ("none", "int8")
SHARD = 1000  # elements per rank; not a multiple of the block size
CHUNK_BYTES = 1024  # several pipeline pieces per chunk in the ring reduce-scatter


def cases() -> list[tuple[str, str, str, torch.dtype]]:
    found = []
    for dtype in DTYPES:
        for codec in CODECS:
            for algorithm in ALL_GATHER:
                found.append(("all_gather", algorithm, codec, dtype))
            for algorithm in REDUCTIONS:
                found.append(("reduce_scatter", algorithm, codec, dtype))
                found.append(("all_reduce", algorithm, codec, dtype))
                if codec in AVERAGED:
                    found.append(("reduce_scatter/avg", algorithm, codec, dtype))
                    found.append(("all_reduce/avg", algorithm, codec, dtype))
    return found  # a call the collectives refuse is recorded as refused


def key(op: str, algorithm: str, codec: str, dtype: torch.dtype, world_size: int) -> str:
    return f"{op} {algorithm} {codec} {str(dtype).removeprefix('torch.')} n={world_size}"


def fixed_input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1234 + rank)
    scale = torch.linspace(0.1, 10.0, numel)
    return (torch.randn(numel, generator=generator) * scale).to(dtype)


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def run_case(rank: int, world_size: int, op, algorithm, codec, dtype) -> str:
    """The digest of this rank's output, or the kind of error a refused call raised."""
    try:
        return _run_case(rank, world_size, op, algorithm, codec, dtype)
    except (TypeError, ValueError) as error:
        return f"refused: {type(error).__name__}"


def _run_case(rank: int, world_size: int, op, algorithm, codec, dtype) -> str:
    op, _, reduction = op.partition("/")
    reduce_op = dist.ReduceOp.AVG if reduction == "avg" else dist.ReduceOp.SUM
    if op == "all_gather":
        inp = fixed_input(rank, SHARD, dtype)
        out = torch.empty(world_size * SHARD, dtype=dtype)
        cp.all_gather_into_tensor(out, inp, codec=codec, algorithm=algorithm)
        return digest(out)
    if op == "reduce_scatter":
        inp = fixed_input(rank, world_size * SHARD, dtype)
        out = torch.empty(SHARD, dtype=dtype)
        cp.reduce_scatter_tensor(
            out, inp, reduce_op, codec=codec, algorithm=algorithm, chunk_bytes=CHUNK_BYTES
        )
        return digest(out)
    tensor = fixed_input(rank, world_size * SHARD + 3, dtype)  # padded to n chunks
    cp.all_reduce(tensor, reduce_op, codec=codec, algorithm=algorithm)
    return digest(tensor)


def outputs(rank: int, world_size: int, window=None, algorithm=None, chosen=None) -> dict:
    """Each case's digest on this rank, under the case's name; cases run in a fixed order,
    since stochastic rounding draws from one stream per (codec, rank). ``window``: steps in
    flight; ``algorithm``: run every case with this one instead (still named as the case)."""
    if window is not None:
        from commpress.collectives import executor

        executor.WINDOW = window
    return {
        key(op, named, codec, dtype, world_size): run_case(
            rank, world_size, op, algorithm or named, codec, dtype
        )
        for op, named, codec, dtype in (chosen or cases())
    }


def compute(world_sizes=WORLD_SIZES, window=None, algorithm=None, cases=None) -> dict:
    try:
        from commpress.cluster.local import run_distributed
    except ImportError:  # the version the digests were written with kept it in testing/
        from commpress.testing.distributed import run_distributed

    table: dict[str, list[str]] = {}
    for world_size in world_sizes:
        by_rank = run_distributed(outputs, world_size, window, algorithm, cases, timeout=600)
        for name in by_rank[0]:
            table[name] = [by_rank[rank][name] for rank in range(world_size)]
    return table


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
