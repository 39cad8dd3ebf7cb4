"""The ring: rank r sends to r + 1 and receives from r - 1 (mod n), n - 1 rounds.

``ring`` compresses at the collective level (IPDPS'23): an all-gather encodes each shard
once at its owner and forwards the payload unchanged; a reduce-scatter decodes each
partial sum it receives, adds its own contribution in fp32 and re-encodes it, piece by
piece so that one piece is on the wire while the previous one is being added.
``ring-hop`` is the point-to-point baseline of MPI libraries: every hop decodes and
re-encodes, and a reduce-scatter sends whole chunks.
"""

from __future__ import annotations

import torch

from commpress.schedules.payloads import partial_sum_dtype, piece_numel, pieces
from commpress.schedules.steps import Prepare, Receive, Schedule, Send, Step, Then, Transport

P2P = Transport.P2P


def neighbours(rank: int, world_size: int) -> tuple[int, int]:
    """``(left, right)`` of ``rank`` in the ring."""
    return (rank - 1) % world_size, (rank + 1) % world_size


def all_gather(
    rank: int,
    world_size: int,
    numel: int,
    dtype: torch.dtype,
    codec,
    *,
    hop: bool,
    chunk_bytes: int | None = None,
) -> Schedule:
    """Round s forwards the chunk received in round s - 1 (in round 0, the own one).
    With ``chunk_bytes``, each chunk is cut into pieces of that many bytes of fp32, one step
    each, so that a piece can be forwarded while the next one is arriving. The registered
    ``ring`` and ``ring-hop`` send whole chunks: on the project's 2-core machine every extra
    step costs more than the overlap wins (``benchmarks/schedules_2026-11-25/README.md``)."""

    def then(last: bool) -> Then:
        return Then.DECODE_REENCODE if hop and not last else Then.DECODE

    whole = hop or chunk_bytes is None
    cuts = pieces(numel, numel if whole else piece_numel(chunk_bytes))
    steps = _rounds(rank, world_size, cuts, lambda size: codec.wire_bytes(size, dtype), 0, then)
    name = "ring-hop" if hop else "ring"
    return Schedule.of("all_gather", name, codec, rank, world_size, numel, dtype, P2P, steps)


def reduce_scatter(
    rank: int,
    world_size: int,
    numel: int,
    dtype: torch.dtype,
    codec,
    *,
    hop: bool,
    chunk_bytes: int,
) -> Schedule:
    """Round s sends the partial sum of chunk r - s - 1 and receives chunk r - s - 2; the
    chunk received in round s is the one sent in round s + 1, after adding the own
    contribution, and the last one received is the rank's own, summed over every rank.
    ``ring`` cuts each chunk into pieces of ``chunk_bytes`` of fp32, one step each."""

    def then(last: bool) -> Then:
        return Then.ADD_KEEP if last else Then.ADD_REENCODE

    sent_dtype = partial_sum_dtype(codec, dtype)
    cuts = pieces(numel, numel if hop else piece_numel(chunk_bytes))
    wire = lambda size: codec.wire_bytes(size, sent_dtype)  # noqa: E731
    steps = _rounds(rank, world_size, cuts, wire, 1, then)
    name = "ring-hop" if hop else "ring"
    return Schedule.of(
        "reduce_scatter", name, codec, rank, world_size, numel, sent_dtype, P2P, steps
    )


def _rounds(rank, world_size, cuts, wire, lag: int, then) -> tuple[Step, ...]:
    """n - 1 rounds, one step per piece: round s sends chunk r - s - ``lag`` to the right
    (encoding the own data in round 0, forwarding after) and receives chunk
    r - s - ``lag`` - 1 from the left, to be handled as ``then(last round)`` says."""
    left, right = neighbours(rank, world_size)
    steps = []
    for step in range(world_size - 1):
        for index, (offset, size) in enumerate(cuts):
            send = Send(
                dsts=(right,),
                chunk=(rank - step - lag) % world_size,
                piece=index,
                offset=offset,
                numel=size,
                wire_bytes=wire(size),
                prepare=Prepare.ENCODE if step == 0 else Prepare.FORWARD,
            )
            receive = Receive(
                src=left,
                chunk=(rank - step - lag - 1) % world_size,
                piece=index,
                offset=offset,
                numel=size,
                wire_bytes=wire(size),
                then=then(step == world_size - 2),
            )
            steps.append(Step(step, (send,), (receive,)))
    return tuple(steps)
