"""Encode once, one exchange through the backend's own collective.

``alltoall`` (reduce-scatter): each rank encodes each destination's slice once, the
backend's all-to-all moves them, each destination decodes and sums in fp32: one rounding
per contribution instead of n - 1 re-quantizations of a partial sum.
``backend`` (all-gather, as ZeRO++ does): each rank encodes its shard once and the
backend's all-gather moves the payloads, in native code (NCCL's or gloo's own ring).
"""

from __future__ import annotations

import torch

from commpress.schedules.payloads import dtype_name
from commpress.schedules.steps import Prepare, Receive, Schedule, Send, Step, Then, Transport


def all_gather(rank: int, world_size: int, numel: int, dtype: torch.dtype, codec) -> Schedule:
    """One step: the own payload to every other rank, every other rank's payload in."""
    wire = codec.wire_bytes(numel, dtype)
    others = tuple(peer for peer in range(world_size) if peer != rank)
    sends = (Send(others, rank, 0, 0, numel, wire, Prepare.ENCODE),) if others else ()
    receives = tuple(Receive(peer, peer, 0, 0, numel, wire, Then.DECODE) for peer in others)
    return Schedule(
        op="all_gather",
        algorithm="backend",
        codec=str(codec),
        rank=rank,
        world_size=world_size,
        chunk_numel=numel,
        payload_dtype=dtype_name(dtype),
        transport=Transport.ALL_GATHER,
        steps=(Step(0, sends, receives),) if others else (),
    )


def reduce_scatter(
    rank: int, world_size: int, numel: int, dtype: torch.dtype, codec, *, algorithm: str
) -> Schedule:
    """One step: slice d to rank d, every other rank's slice of the own chunk in."""
    wire = codec.wire_bytes(numel, dtype)
    others = tuple(peer for peer in range(world_size) if peer != rank)
    sends = tuple(Send((peer,), peer, 0, 0, numel, wire, Prepare.ENCODE) for peer in others)
    receives = tuple(Receive(peer, rank, 0, 0, numel, wire, Then.SUM) for peer in others)
    return Schedule(
        op="reduce_scatter",
        algorithm=algorithm,
        codec=str(codec),
        rank=rank,
        world_size=world_size,
        chunk_numel=numel,
        payload_dtype=dtype_name(dtype),
        transport=Transport.ALL_TO_ALL,
        steps=(Step(0, sends, receives),) if others else (),
    )
