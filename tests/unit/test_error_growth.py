"""The growth of a codec's error along each schedule, against formulas worked by hand.

A ring reduce-scatter's partial sum of k contributions is re-encoded at hop k: the squared
errors add up to ``e**2 * (1 + 2 + ... + (n - 1))`` over a result of squared norm ``n``,
so ``g = sqrt((n - 1) / 2)``. Encoded once per contribution and summed at the destination
(the own one exact): ``sqrt((n - 1) / n)``. An all-gather that forwards payloads as they
came: 1. ``ring-hop``'s all-gather with a codec that is not idempotent rounds the shard
from d hops away d times: ``sqrt((1 + (1 + ... + (n - 1))) / n)``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from commpress.schedules import plan
from commpress.schedules.error_growth import error_growth

WORLDS = (2, 3, 4, 5, 8, 16, 33, 64)


def _growth(op, algorithm, n, rank=0, idempotent=True):
    numel = 300 * (n if op == "reduce_scatter" else 1)
    (schedule,) = plan(op, algorithm, rank, n, numel, torch.float32, "int8", 512)
    return error_growth(schedule, idempotent)


@pytest.mark.parametrize("n", WORLDS)
def test_each_algorithm_against_its_formula(n):
    ring = math.sqrt((n - 1) / 2)
    once = math.sqrt((n - 1) / n)
    # ring's reduce-scatter in pieces of 128 elements, the last one shorter: same growth
    assert _growth("reduce_scatter", "ring", n) == pytest.approx(ring)
    assert _growth("reduce_scatter", "ring-hop", n) == pytest.approx(ring)
    assert _growth("reduce_scatter", "alltoall", n) == pytest.approx(once)
    assert _growth("reduce_scatter", "backend", n) == pytest.approx(once)
    for algorithm in ("ring", "ring-hop", "backend", "multicast"):
        assert _growth("all_gather", algorithm, n) == pytest.approx(1.0)
    hops = math.sqrt((1 + n * (n - 1) / 2) / n)
    assert _growth("all_gather", "ring-hop", n, idempotent=False) == pytest.approx(hops)
    assert _growth("all_gather", "ring", n, idempotent=False) == pytest.approx(1.0)


@pytest.mark.parametrize("n", [3, 4, 7])
def test_every_rank_reads_the_same_growth(n):
    """What a peer sent is read from this rank's own schedule, shifted: any rank gives the
    same answer."""
    for op, algorithm in (("reduce_scatter", "ring"), ("reduce_scatter", "alltoall"),
                          ("all_gather", "multicast"), ("all_gather", "ring-hop")):  # fmt: skip
        growths = {_growth(op, algorithm, n, rank, idempotent=False) for rank in range(n)}
        assert len(growths) == 1 and growths.pop() > 0


def test_a_world_of_one():
    assert _growth("reduce_scatter", "ring", 1) == 0.0  # the own chunk, copied
    assert _growth("all_gather", "ring", 1) == 1.0  # encoded and decoded like any shard


def test_a_schedule_that_is_not_rank_symmetric_is_refused():
    (schedule,) = plan("reduce_scatter", "ring", 0, 4, 1200, torch.float32, "int8")
    first = schedule.steps[0]
    moved = dataclasses.replace(first.receives[0], chunk=(first.receives[0].chunk + 1) % 4)
    broken = dataclasses.replace(
        schedule, steps=(dataclasses.replace(first, receives=(moved,)), *schedule.steps[1:])
    )
    with pytest.raises(ValueError, match="not rank-symmetric"):
        error_growth(broken, True)
