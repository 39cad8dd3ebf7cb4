"""The paired comparison the benchmarks report (``commpress.bench.paired``)."""

from __future__ import annotations

import random

import pytest

from commpress.bench.paired import (
    difference_deciles,
    paired_arguments,
    paired_difference,
    paired_ratio,
)


def _rounds(shift: float, n: int = 400, seed: int = 1):
    """Round-by-round times of two variants on a machine whose speed drifts between
    rounds by far more than ``shift``: ``a`` costs ``shift`` more than ``b`` in each."""
    draw = random.Random(seed)
    base = [draw.uniform(5.0, 9.0) for _ in range(n)]
    a = [t + shift + draw.gauss(0, 0.05) for t in base]
    b = [t + draw.gauss(0, 0.05) for t in base]
    return a, b


def test_a_cost_hidden_in_drift_is_found_with_its_sign_and_size():
    a, b = _rounds(0.3)
    middle, low, high = paired_difference(a, b)
    assert 0.25 < middle < 0.35 and 0 < low < middle < high < 0.4
    negated = paired_difference(b, a)  # the comparison the wrong way round
    assert negated[0] == pytest.approx(-middle) and negated[2] < 0


def test_no_cost_gives_an_interval_around_zero():
    middle, low, high = paired_difference(*_rounds(0.0))
    assert low < 0 < high and abs(middle) < 0.02


def test_the_middle_is_the_median_of_the_differences_not_their_mean():
    """One slow round (a machine hiccup) moves a mean, not a median."""
    a = [5.0] * 19 + [105.0]
    b = [4.0] * 20
    assert paired_difference(a, b) == (1.0, 1.0, 1.0)  # the mean would be 6


def test_a_ratio_drifting_with_the_rounds_is_found_and_its_inverse_the_other_way():
    """Rounds whose times drift (base 5 to 9) but keep ``a`` 1.2x ``b``."""
    a, b = _rounds(0.0)
    a = [1.2 * t for t in b]
    a[3] *= 3  # one disturbed round moves a median of ratios little
    middle, low, high = paired_ratio(a, b)
    assert middle == pytest.approx(1.2) and low <= middle <= high < 1.3
    inverse = paired_ratio(b, a)
    assert inverse[0] == pytest.approx(1 / 1.2) and inverse[2] < 1
    with pytest.raises(ValueError, match="same non-zero length"):
        paired_ratio(a, b[:-1])


def test_identical_differences_give_an_interval_of_width_zero():
    assert paired_difference([3.0] * 7, [1.0] * 7) == (2.0, 2.0, 2.0)


def test_the_deciles_spread_the_differences_around_their_median_with_their_sign():
    a = [10.0 + i for i in range(11)]  # differences 0, 1, ..., 10 in a shuffled pairing
    b = [10.0] * 11
    order = random.Random(3).sample(range(11), 11)
    middle, low, high = difference_deciles([a[i] for i in order], [b[i] for i in order])
    assert (middle, low, high) == (5.0, pytest.approx(0.2), pytest.approx(9.8))
    assert difference_deciles(b, a) == (-5.0, pytest.approx(-9.8), pytest.approx(-0.2))
    with pytest.raises(ValueError, match="same length of 2 or more"):
        difference_deciles([1.0], [1.0])


def test_the_deciles_of_a_few_rounds_stay_within_the_differences_measured():
    """From a bug hunt: under 9 rounds the deciles extrapolated past the differences
    (``statistics.quantiles``' default method): rounds 0.5 and 2.0 faster in both showed a
    10th percentile of -0.55, slower, and a 90th of 3.05, faster than any round."""
    middle, low, high = difference_deciles([1.5, 3.0], [1.0, 1.0])
    assert (middle, low, high) == (1.25, 0.5, 2.0)
    for rounds in range(2, 12):
        differences = [float(i * i) for i in range(rounds)]
        middle, low, high = difference_deciles(differences, [0.0] * rounds)
        assert 0.0 <= low <= middle <= high <= (rounds - 1) ** 2, rounds


def test_rounds_must_pair_up():
    with pytest.raises(ValueError, match="same non-zero length"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="same non-zero length"):
        paired_difference([], [])


def _rounds_taken(rank, world_size):
    from commpress.bench.paired import interleaved_rounds

    order, undone = [], []

    def switch(variant):
        order.append(variant)
        return lambda: undone.append(variant)

    times = interleaved_rounds(lambda: None, ["a", "b", "c"], rounds=2, switch=switch, warmup=1)
    return order, undone, {v: len(t) for v, t in times.items()}


def test_interleaved_rounds_rotate_the_order_and_drop_the_warmup():
    from commpress.cluster.local import run_distributed

    ((order, undone, kept),) = run_distributed(_rounds_taken, 1, timeout=60)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert undone == order  # every variant undone after its call
    assert kept == {"a": 2, "b": 2, "c": 2}


def _calls_taken(rank, world_size):
    from commpress.bench.paired import interleaved_calls

    ran = []
    calls = {variant: (lambda v=variant: ran.append(v)) for variant in ("a", "b", "c")}
    times = interleaved_calls(calls, rounds=2, warmup=1)
    return ran, {v: len(t) for v, t in times.items()}


def test_interleaved_calls_run_each_variants_own_call():
    from commpress.cluster.local import run_distributed

    ((ran, kept),) = run_distributed(_calls_taken, 1, timeout=60)
    assert ran == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert kept == {"a": 2, "b": 2, "c": 2}


def test_paired_arguments_parse_lists_of_sizes_and_codecs(capsys):
    parser = paired_arguments("x", prefix="t", sizes="1M,4M", codecs="int8", rounds=5)
    defaults = parser.parse_args([])
    assert (defaults.sizes, defaults.codecs, defaults.rounds) == ([1 << 20, 4 << 20], ["int8"], 5)
    assert (defaults.hosts, defaults.prefix) == (8, "t")
    given = parser.parse_args(["--sizes", "64K", "--codecs", "none, int4", "--hosts", "2"])
    assert (given.sizes, given.codecs, given.hosts) == ([64 << 10], ["none", "int4"], 2)
    with pytest.raises(SystemExit):
        parser.parse_args(["--sizes", "0"])
    assert "--sizes" in capsys.readouterr().err
    for rounds in ("0", "1"):  # the run ended in difference_deciles' ValueError
        with pytest.raises(SystemExit):
            parser.parse_args(["--rounds", rounds])
        assert "needs 2 rounds or more" in capsys.readouterr().err
