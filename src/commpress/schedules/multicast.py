"""The multicast all-gather: one broadcast per rank, each injected once, replicated by the
network (Khalilov et al., SC 2024).

Step ``p`` is the broadcast of root ``order[p]``: that root sends its encoded shard to every
other rank at once; every other rank receives it and decodes it. The transport runs up to
K broadcasts at once, in this order; the order takes the first and second half of the ranks
in turn (0, n/2, 1, n/2 + 1, ...), so that two roots sending at once sit in different halves
of a rack-by-rack numbering: on two racks, one root per rack, each on its own uplink.
"""

from __future__ import annotations

import torch

from commpress.schedules.steps import Prepare, Receive, Schedule, Send, Step, Then, Transport


def root_order(world_size: int) -> tuple[int, ...]:
    """0, h, 1, h + 1, ... with h = ceil(n / 2): the two halves interleaved."""
    half = -(-world_size // 2)
    firsts, seconds = range(half), range(half, world_size)
    order = [rank for pair in zip(firsts, seconds, strict=False) for rank in pair]
    return tuple(order + list(firsts[len(seconds) :]))


def all_gather(rank: int, world_size: int, numel: int, dtype: torch.dtype, codec) -> Schedule:
    wire = codec.wire_bytes(numel, dtype)
    steps = []
    for position, root in enumerate(root_order(world_size) if world_size > 1 else ()):
        if root == rank:
            others = tuple(peer for peer in range(world_size) if peer != rank)
            steps.append(
                Step(position, (Send(others, root, 0, 0, numel, wire, Prepare.ENCODE),), ())
            )
        else:
            steps.append(Step(position, (), (Receive(root, root, 0, 0, numel, wire, Then.DECODE),)))
    return Schedule.of(
        "all_gather", "multicast", codec, rank, world_size, numel, dtype, Transport.MULTICAST, steps
    )
