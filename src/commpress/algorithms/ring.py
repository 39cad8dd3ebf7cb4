"""The ring: rank r sends to r + 1 and receives from r - 1 (mod n) at every step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RingStep:
    """One ring step: send chunk ``send`` to the right, receive chunk ``recv`` from the left."""

    send: int
    recv: int


def neighbours(rank: int, world_size: int) -> tuple[int, int]:
    """``(left, right)`` of ``rank`` in the ring."""
    return (rank - 1) % world_size, (rank + 1) % world_size


def all_gather_steps(rank: int, world_size: int) -> list[RingStep]:
    """n - 1 steps; step s forwards the chunk received at step s - 1 (at s = 0, the own one).

    After the last step every rank has received every chunk exactly once.
    """
    return [
        RingStep(send=(rank - step) % world_size, recv=(rank - step - 1) % world_size)
        for step in range(world_size - 1)
    ]


def reduce_scatter_steps(rank: int, world_size: int) -> list[RingStep]:
    """n - 1 steps; step s sends the partial sum of chunk ``send`` and receives ``recv``.

    The chunk received at step s is the one sent at step s + 1, after adding the own
    contribution; the last chunk received is the rank's own, now summed over all ranks.
    """
    return [
        RingStep(send=(rank - step - 1) % world_size, recv=(rank - step - 2) % world_size)
        for step in range(world_size - 1)
    ]
