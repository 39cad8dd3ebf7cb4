"""Encode once, one exchange through the backend's own collective.

``alltoall`` (reduce-scatter): each rank encodes each destination's slice once, one
all-to-all per pipeline piece moves them (NCCL's own; on gloo with CPU tensors and large
payloads, point-to-point sends and receives, every receive posted first:
``commpress.collectives.executor.POINT_TO_POINT_FROM_BYTES``), each
destination decodes and sums in fp32, a piece while the next one is on the wire: one
rounding per contribution instead of n - 1 re-quantizations of a partial sum. ``backend``'s
reduce-scatter is the same in one all-to-all of whole slices.
``backend`` (all-gather, as ZeRO++ does): each rank encodes its shard once and the
backend's all-gather moves the payloads, in native code (NCCL's or gloo's own ring; on
gloo with two ranks, CPU tensors and large payloads, one point-to-point exchange).
"""

from __future__ import annotations

import torch

from commpress.schedules.payloads import piece_numel, pieces
from commpress.schedules.steps import Prepare, Receive, Schedule, Send, Step, Then, Transport

ALL_GATHER, ALL_TO_ALL = Transport.ALL_GATHER, Transport.ALL_TO_ALL


def all_gather(rank: int, world_size: int, numel: int, dtype: torch.dtype, codec) -> Schedule:
    """One step: the own payload to every other rank, every other rank's payload in."""
    wire = codec.wire_bytes(numel, dtype)
    others = tuple(peer for peer in range(world_size) if peer != rank)
    sends = (Send(others, rank, 0, 0, numel, wire, Prepare.ENCODE),) if others else ()
    receives = tuple(Receive(peer, peer, 0, 0, numel, wire, Then.DECODE) for peer in others)
    steps = (Step(0, sends, receives),) if others else ()
    return Schedule.of(
        "all_gather", "backend", codec, rank, world_size, numel, dtype, ALL_GATHER, steps
    )


def reduce_scatter(
    rank: int,
    world_size: int,
    numel: int,
    dtype: torch.dtype,
    codec,
    *,
    algorithm: str,
    chunk_bytes: int | None = None,
) -> Schedule:
    """Slice d to rank d, every other rank's slice of the own chunk in; with ``chunk_bytes``,
    in pieces of that many bytes of fp32, one step (one exchange) each, so that a piece is
    summed while the next one is on the wire; without, the whole slices in one step."""
    others = tuple(peer for peer in range(world_size) if peer != rank)
    cuts = pieces(numel, numel if chunk_bytes is None else piece_numel(chunk_bytes))
    steps = []
    for index, (offset, size) in enumerate(cuts if others else ()):
        wire = codec.wire_bytes(size, dtype)
        sends = tuple(
            Send((peer,), peer, index, offset, size, wire, Prepare.ENCODE) for peer in others
        )
        receives = tuple(
            Receive(peer, rank, index, offset, size, wire, Then.SUM) for peer in others
        )
        steps.append(Step(0, sends, receives))
    return Schedule.of(
        "reduce_scatter", algorithm, codec, rank, world_size, numel, dtype, ALL_TO_ALL, steps
    )
