"""A peer that stalls, for tests of timeouts: it stays out of the collective until every
other rank has reported (or a longest wait has passed), so that a test waits for the
others' timeouts and not for a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

POLL_SECONDS = 0.05


def report(directory: str | Path, rank: int) -> None:
    """Tell the stalled peer that ``rank`` is done (its error caught, or its result in)."""
    (Path(directory) / f"reported-{rank}").touch()


def stall(directory: str | Path, others: Iterable[int], longest: float) -> float:
    """Block until every rank of ``others`` has reported, or ``longest`` seconds; the
    seconds stalled."""
    start = time.monotonic()
    waiting = [Path(directory) / f"reported-{rank}" for rank in others]
    while time.monotonic() - start < longest and not all(path.exists() for path in waiting):
        time.sleep(POLL_SECONDS)
    return time.monotonic() - start


def outcome(call) -> tuple[str, str, float]:
    """``(error type, message, seconds)`` of ``call()``: a ``RuntimeError`` caught,
    ``("no error", "", seconds)`` where none."""
    start = time.monotonic()
    try:
        call()
    except RuntimeError as error:
        return type(error).__name__, str(error)[:400], time.monotonic() - start
    return "no error", "", time.monotonic() - start


def timed_outcome(call, directory: str | Path, rank: int) -> tuple[str, str, float]:
    """:func:`outcome` of ``call()`` on a rank that waits for a stalled peer, ``rank``
    reported as done either way."""
    try:
        return outcome(call)
    finally:
        report(directory, rank)
