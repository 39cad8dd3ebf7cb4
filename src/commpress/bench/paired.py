"""The paired comparison of two variants timed round by round in one run.

Two variants run back to back in each round (their order varied by the caller); what is
compared is the per-round difference, whose median is robust to the slow rounds a shared
machine throws in, and whose 95% bootstrap interval says whether the machine can tell the
difference from none at all (an interval that straddles zero: it cannot).
"""

from __future__ import annotations

import argparse
import operator
import random
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from commpress.bench.arguments import byte_size, comma_list, output_path, whole_number
from commpress.cluster.commands import add_link_arguments
from commpress.cluster.link import DEFAULT_MTU


def paired_difference(
    a: Sequence[float], b: Sequence[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``(median, low, high)`` of the per-round differences ``a - b``: their median and a
    95% percentile-bootstrap interval of it. Rounds are assumed independent (on a shared
    VM they are not quite: read single intervals with care)."""
    return _median_interval(_per_round(a, b, operator.sub), resamples, seed)


def paired_ratio(
    a: Sequence[float], b: Sequence[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``(median, low, high)`` of the per-round ratios ``a / b``, as
    :func:`paired_difference` gives the differences."""
    return _median_interval(_per_round(a, b, operator.truediv), resamples, seed)


def _per_round(a: Sequence[float], b: Sequence[float], combine) -> list[float]:
    """``combine(a[i], b[i])`` for each round ``i``; ValueError unless a and b are rounds
    of the same non-zero number."""
    if len(a) != len(b) or not a:
        raise ValueError(f"a and b must be the same non-zero length, got {len(a)} and {len(b)}")
    return [combine(x, y) for x, y in zip(a, b, strict=True)]


def _median_interval(values: list[float], resamples: int, seed: int) -> tuple[float, float, float]:
    """The median of ``values`` and a 95% percentile-bootstrap interval of it."""
    draw = random.Random(seed)
    medians = sorted(
        statistics.median(draw.choices(values, k=len(values))) for _ in range(resamples)
    )
    tail = int(0.025 * resamples)
    return statistics.median(values), medians[tail], medians[resamples - tail - 1]


def difference_deciles(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """``(median, 10th, 90th percentile)`` of the per-round differences ``a - b``: how the
    rounds spread, where :func:`paired_difference` bounds their median. The deciles stay
    within the differences measured: under 9 rounds, ``statistics.quantiles``' method
    extrapolates past them (a difference of one sign in every round could show a decile of
    the other), so they are held to the smallest and largest difference."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"a and b must be the same length of 2 or more, got {len(a)}, {len(b)}")
    differences = [x - y for x, y in zip(a, b, strict=True)]
    deciles = statistics.quantiles(differences, n=10)
    least, most = min(differences), max(differences)
    return statistics.median(differences), max(least, deciles[0]), min(most, deciles[-1])


def slowest_rank_seconds(call: Callable[[], object], group=None) -> float:
    """Run ``call`` on every rank of ``group`` from a barrier; the slowest rank's seconds,
    on every rank (a collective: every rank must call it)."""
    dist.barrier(group)
    start = time.perf_counter()
    call()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return elapsed.item()


def interleaved_rounds(
    call: Callable[[], object],
    variants: Sequence[str],
    rounds: int,
    switch: Callable[[str], Callable[[], object]],
    warmup: int = 3,
) -> dict[str, list[float]]:
    """Each variant's :func:`slowest_rank_seconds` of ``call``, round by round: the
    variants of a round run back to back, their order rotated from one round to the next
    (the position in a round biases a call's time), after ``warmup`` rounds not kept.
    ``switch(variant)`` puts a variant in place and returns what undoes it. A collective:
    every rank must call it with the same variants."""
    variants = list(variants)
    times: dict[str, list[float]] = {variant: [] for variant in variants}
    for index in range(warmup + rounds):
        turn = index % len(variants)
        for variant in variants[turn:] + variants[:turn]:
            undo = switch(variant)
            elapsed = slowest_rank_seconds(call)
            undo()
            if index >= warmup:
                times[variant].append(elapsed)
    return times


def interleaved_calls(
    calls: dict[str, Callable[[], object]], rounds: int, warmup: int = 3
) -> dict[str, list[float]]:
    """:func:`interleaved_rounds` of variants that are calls of their own: ``calls`` maps
    each variant to what it runs. A collective: every rank must give the same variants."""
    current: dict[str, Callable[[], object]] = {}

    def switch(variant: str) -> Callable[[], None]:
        current["call"] = calls[variant]
        return lambda: None

    return interleaved_rounds(lambda: current["call"](), list(calls), rounds, switch, warmup)


def paired_arguments(
    description: str, *, prefix: str, sizes: str, codecs: str, rounds: int
) -> argparse.ArgumentParser:
    """The command line of a paired benchmark on the emulated cluster: its links (8 hosts
    at 1 Gbit/s, MTU 1500 unless given), ``--sizes`` (a list of byte sizes), ``--codecs``
    (a list), ``--rounds`` and ``--json``, with these defaults."""
    parser = argparse.ArgumentParser(description=description)
    add_link_arguments(parser, required=False)
    parser.set_defaults(hosts=8, link="1gbit", mtu=DEFAULT_MTU, prefix=prefix)
    parser.add_argument("--sizes", type=_byte_sizes, default=_byte_sizes(sizes))
    parser.add_argument("--codecs", type=comma_list, default=comma_list(codecs))
    parser.add_argument("--rounds", type=round_count, default=rounds)
    parser.add_argument("--json", type=output_path)
    return parser


def round_count(text: str) -> int:
    """``--rounds``: 2 or more, as :func:`difference_deciles` needs."""
    value = whole_number(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: a paired comparison needs 2 rounds or more")
    return value


def _byte_sizes(text: str) -> list[int]:
    return [byte_size(size) for size in comma_list(text)]
