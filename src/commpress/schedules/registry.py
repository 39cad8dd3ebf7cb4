"""Algorithms by name: each one's schedules for all-gather and reduce-scatter.

All-reduce is a reduce-scatter followed by an all-gather of the reduced chunks (in
:func:`~commpress.schedules.payloads.partial_sum_dtype`); an algorithm names the
all-gather its all-reduce uses. ``native`` (torch.distributed's own collective on the raw
tensor) has no schedule here: the collectives call torch for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from commpress.codecs import get_codec
from commpress.schedules import alltoall, multicast, payloads, ring
from commpress.schedules.payloads import chunk_numel, partial_sum_dtype
from commpress.schedules.steps import Schedule

OPS = ("all_gather", "reduce_scatter", "all_reduce")
NATIVE = "native"

#: (rank, world_size, chunk numel, dtype, codec, chunk_bytes) -> Schedule
ScheduleFunction = Callable[[int, int, int, torch.dtype, object, int], Schedule]


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    all_gather: ScheduleFunction | None  # None: this algorithm does not all-gather
    reduce_scatter: ScheduleFunction | None
    all_reduce_gather: str | None  # the algorithm whose all-gather finishes an all-reduce
    host_transport: bool = False  # its transport moves host memory: CUDA payloads are staged

    def supports(self, op: str) -> bool:
        if op == "all_reduce":
            return self.reduce_scatter is not None and self.all_reduce_gather is not None
        return getattr(self, op) is not None


_ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    if algorithm.name in _ALGORITHMS or algorithm.name == NATIVE:
        raise ValueError(f"algorithm {algorithm.name!r} is already registered")
    _ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def algorithms(op: str) -> tuple[str, ...]:
    """Every algorithm that runs ``op``, ``native`` first."""
    _check_op(op)
    return (NATIVE,) + tuple(name for name, a in _ALGORITHMS.items() if a.supports(op))


def every_algorithm() -> tuple[str, ...]:
    """Every algorithm of any op, ``native`` first."""
    return tuple(dict.fromkeys(name for op in OPS for name in algorithms(op)))


#: The algorithms whose reduce-scatter is cut into pieces of ``chunk_bytes`` (of fp32).
PIPELINED_REDUCTIONS = ("ring", "alltoall")


def piece_transfers(
    op: str, algorithm: str, world_size: int, numel: int, chunk_bytes: int | None = None
) -> int:
    """The transfers one rank's schedule of a pipelined reduction holds, each made before
    the first runs: ``world_size - 1`` per piece of a chunk (the ring's rounds, the
    all-to-all's peers); 0 for the schedules that keep whole chunks. ``numel``: the rank's
    input, as :func:`plan` takes it."""
    if op == "all_gather" or algorithm not in PIPELINED_REDUCTIONS:
        return 0
    if chunk_bytes is None:
        chunk_bytes = payloads.DEFAULT_CHUNK_BYTES
    chunk = chunk_numel(numel, world_size)
    return (world_size - 1) * payloads.piece_count(chunk, payloads.piece_numel(chunk_bytes))


#: The algorithms that round every contribution on the rank that owns it: the only ones
#: where error feedback (a residual kept by the sender) is exact.
ERROR_FEEDBACK_ALGORITHMS = ("alltoall", "backend")


def result_gather(op: str, algorithm: str) -> str | None:
    """The algorithm whose all-gather leaves ``op``'s result on every rank: ``algorithm``
    for an all-gather, the one that finishes an all-reduce; None for a reduce-scatter."""
    if op == "all_gather":
        return algorithm
    if op == "all_reduce":
        return get_algorithm(algorithm, op).all_reduce_gather
    return None


def same_result_on_every_rank(codec, algorithm: str) -> bool:
    """Whether an all-gather by ``algorithm`` leaves every rank with the same bits:
    ``ring-hop`` re-encodes at every hop, which only an idempotent codec survives."""
    return algorithm != "ring-hop" or codec.idempotent


def get_algorithm(name: str, op: str) -> Algorithm:
    """The registered algorithm ``name``; ValueError naming those known for ``op``."""
    _check_op(op)
    if name == NATIVE:
        raise ValueError("'native' is torch.distributed's own collective: it has no schedule")
    found = _ALGORITHMS.get(name) if isinstance(name, str) else None  # a list: unhashable
    if found is None or not found.supports(op):
        raise ValueError(f"unknown algorithm {name!r} for {op}; known: {algorithms(op)}")
    return found


def plan(
    op: str,
    algorithm: str,
    rank: int,
    world_size: int,
    numel: int,
    dtype: torch.dtype,
    codec,
    chunk_bytes: int | None = None,
) -> tuple[Schedule, ...]:
    """The schedules rank ``rank`` runs for one call, in order (two for all-reduce).

    ``numel`` is the rank's input: the shard of an all-gather, the whole tensor of a
    reduction, cut into ``ceil(numel / world_size)``-element chunks (an all-reduce pads it;
    the reduce-scatter collective accepts only sizes that divide).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    codec = get_codec(codec)
    get_algorithm(algorithm, op)
    if chunk_bytes is None:
        chunk_bytes = payloads.DEFAULT_CHUNK_BYTES
    return _plan(op, algorithm, rank, world_size, numel, dtype, codec, chunk_bytes)


@functools.lru_cache(maxsize=1024)  # a training step calls the same few collectives again
def _plan(op, algorithm, rank, world_size, numel, dtype, codec, chunk_bytes):
    chosen = _ALGORITHMS[algorithm]
    if op == "all_gather":
        return (chosen.all_gather(rank, world_size, numel, dtype, codec, chunk_bytes),)
    chunk = chunk_numel(numel, world_size)
    reduced = chosen.reduce_scatter(rank, world_size, chunk, dtype, codec, chunk_bytes)
    if op == "reduce_scatter":
        return (reduced,)
    gather = get_algorithm(chosen.all_reduce_gather, "all_gather").all_gather
    gathered_dtype = partial_sum_dtype(codec, dtype)
    return reduced, gather(rank, world_size, chunk, gathered_dtype, codec, chunk_bytes)


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; known: {OPS}")


def _ring_gather(r, n, numel, dtype, codec, _, *, hop: bool) -> Schedule:
    return ring.all_gather(r, n, numel, dtype, codec, hop=hop)  # whole shards


def _ring_reduce(r, n, numel, dtype, codec, chunk_bytes, *, hop: bool) -> Schedule:
    return ring.reduce_scatter(r, n, numel, dtype, codec, hop=hop, chunk_bytes=chunk_bytes)


for _name, _hop, _summary in (
    (
        "ring",
        False,
        "compress at the collective level: encode once (all-gather), or decode, add and "
        "re-encode each partial sum, pipelined in pieces (reduce-scatter)",
    ),
    ("ring-hop", True, "the point-to-point baseline: decode and re-encode at every hop"),
):
    register(
        Algorithm(
            _name,
            _summary,
            all_gather=functools.partial(_ring_gather, hop=_hop),
            reduce_scatter=functools.partial(_ring_reduce, hop=_hop),
            all_reduce_gather=_name,
        )
    )
register(
    Algorithm(
        "alltoall",
        "reduce-scatter: encode each destination's slice once, the backend's all-to-all, "
        "sum in fp32, pipelined in pieces",
        all_gather=None,
        reduce_scatter=lambda r, n, numel, dtype, codec, chunk_bytes: alltoall.reduce_scatter(
            r, n, numel, dtype, codec, algorithm="alltoall", chunk_bytes=chunk_bytes
        ),
        all_reduce_gather="ring",
    )
)
register(
    Algorithm(
        "backend",
        "encode once, the backend's own collective moves the payloads (all-gather; "
        "reduce-scatter is alltoall)",
        all_gather=lambda r, n, numel, dtype, codec, _: alltoall.all_gather(
            r, n, numel, dtype, codec
        ),
        reduce_scatter=lambda r, n, numel, dtype, codec, _: alltoall.reduce_scatter(
            r, n, numel, dtype, codec, algorithm="backend"
        ),
        all_reduce_gather="backend",
    )
)
register(
    Algorithm(
        "multicast",
        "all-gather: each rank injects its encoded shard once, the network replicates it "
        "(reliable UDP multicast, repaired point to point)",
        all_gather=lambda r, n, numel, dtype, codec, _: multicast.all_gather(
            r, n, numel, dtype, codec
        ),
        reduce_scatter=None,
        all_reduce_gather=None,
        host_transport=True,
    )
)
