"""How much a codec's error grows along a schedule.

One encode of a tensor errs by a relative error ``e`` (``||decode(encode(x)) - x|| /
||x||``, about the same at any scale of ``x`` for the codecs here). A schedule may round
a value more than once: a ring reduce-scatter re-encodes each partial sum at every hop, and
``ring-hop`` re-encodes each forwarded shard (which adds nothing for an idempotent codec;
a codec that is not idempotent is counted as rounding again at its full error, a bound
rather than a measurement: no collective runs such a pair today).
:func:`error_growth` walks a schedule's actions and returns the factor ``g`` by which the
result errs, ``g * e``, assuming that the ranks' contributions are independent and of the
same norm and that every rounding's error is independent of the others (as on Gaussian
data: ``tests/distributed/test_expected_error.py`` measures it on the collectives). On an
n-rank ring reduce-scatter ``g = sqrt((n - 1) / 2)``; encoded once per contribution
(``alltoall``), ``g = sqrt((n - 1) / n)``.

Only one rank's schedule is read: every registered algorithm is rank-symmetric (rank
``r + d`` does what rank ``r`` does with every chunk and peer shifted by ``d``), so what a
peer sends is what this rank sends, shifted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commpress.schedules.steps import Prepare, Schedule, Then


@dataclass(frozen=True)
class _Value:
    """A payload's history: how many ranks' contributions it sums, and its rounding error's
    squared norm in units of ``e**2`` times one contribution's squared norm."""

    contributions: int
    error: float

    def rounded(self) -> _Value:
        """After one more encode (its squared norm is ``contributions`` units)."""
        return _Value(self.contributions, self.error + self.contributions)

    def plus(self, other: _Value) -> _Value:
        return _Value(self.contributions + other.contributions, self.error + other.error)


_OWN = _Value(1, 0.0)  # the rank's own contribution, exact


def error_growth(schedule: Schedule, idempotent: bool) -> float:
    """The factor by which one encode's relative error grows in ``schedule``'s result (this
    rank's output: every chunk of an all-gather, the own chunk of a reduce-scatter);
    ``idempotent``: whether re-encoding a decoded payload gives the same payload."""
    n, rank = schedule.world_size, schedule.rank
    sent: dict[tuple[int, int, int], _Value] = {}  # (chunk, piece, destination) -> value
    kept: dict[tuple[int, int], _Value] = {}  # a payload held to be forwarded later
    output: dict[tuple[int, int], tuple[int, _Value]] = {}  # (chunk, piece) -> (numel, value)
    gathers = schedule.op == "all_gather"
    encoded = _OWN.rounded()
    for send in _sends(schedule, Prepare.ENCODE):  # known before any step (a peer's may come first)
        for destination in send.dsts:
            sent[send.chunk, send.piece, destination] = encoded
        if gathers:
            output[send.chunk, send.piece] = send.numel, encoded  # the owner keeps it decoded
    for step in schedule.steps:
        for send in step.sends:
            if send.prepare is Prepare.FORWARD:
                for destination in send.dsts:
                    sent[send.chunk, send.piece, destination] = kept[send.chunk, send.piece]
        for receive in step.receives:
            key = receive.chunk, receive.piece
            arriving = _sent_by_peer(sent, receive, rank, n)
            if receive.then is Then.DECODE:
                output[key] = receive.numel, arriving
                kept[key] = arriving  # forwarded as it came
            elif receive.then is Then.DECODE_REENCODE:
                output[key] = receive.numel, arriving
                kept[key] = arriving if idempotent else arriving.rounded()
            elif receive.then is Then.ADD_REENCODE:
                kept[key] = arriving.plus(_OWN).rounded()
            elif receive.then is Then.ADD_KEEP:
                output[key] = receive.numel, arriving.plus(_OWN)
            elif receive.then is Then.SUM:
                numel, total = output.get(key, (receive.numel, _OWN))
                output[key] = numel, total.plus(arriving)
            else:
                raise ValueError(f"no error rule for {receive.then}")
    if not output:  # a world of one: a reduce-scatter copies, an all-gather encodes once
        return 1.0 if gathers else 0.0
    error = sum(numel * value.error for numel, value in output.values())
    norm = sum(numel * value.contributions for numel, value in output.values())
    return math.sqrt(error / norm)


def _sends(schedule: Schedule, prepare: Prepare):
    return [send for step in schedule.steps for send in step.sends if send.prepare is prepare]


def _sent_by_peer(sent: dict, receive, rank: int, n: int) -> _Value:
    """What ``receive.src`` sent: by symmetry, what this rank sends with every chunk and
    peer shifted back by ``src - rank``."""
    shift = receive.src - rank
    key = (receive.chunk - shift) % n, receive.piece, (rank - shift) % n
    found = sent.get(key)
    if found is None:
        raise ValueError(
            f"{receive} has no matching send on this rank, shifted by {shift}, up to its step: "
            "the schedule is not rank-symmetric"
        )
    return found
