"""``algorithm="auto"`` and ``codec="auto:..."``: the tuner takes the model's fastest pair
within the error budget, and refuses what it cannot satisfy."""

from __future__ import annotations

import logging

import pytest
import torch

from commpress.integrations.spec import CollectiveSpec
from commpress.sim import Params, Switch, simulate, tuner


@pytest.fixture(autouse=True)
def network():
    yield tuner.configure(link="1gbit")
    tuner.configure()  # back to the defaults for the next test


def _fastest(op, numel, n, pairs):
    size = numel * 4 * (n if op == "all_gather" else 1)
    timed = [(simulate(op, a, c, size, Switch(n, 1e9), Params()).time_us, a, c) for a, c in pairs]
    return min(timed)[1:]


def test_the_choice_is_the_models_fastest_candidate():
    for numel in (256, 1 << 16, 1 << 22):
        choice = tuner.choose("all_gather", numel, torch.float32, 4, "int8")
        pairs = [("native", "none"), ("ring", "int8"), ("backend", "int8")]
        expected = _fastest("all_gather", numel, 4, pairs)
        assert (choice.algorithm, choice.codec) == expected


def test_the_error_budget_admits_only_codecs_that_measure_within_it():
    for limit in (0.0, 1e-3, 1e-2, 0.2):
        choice = tuner.choose(
            "all_gather", 1 << 20, torch.float32, 8, f"auto:max_rel_err={limit}", "ring"
        )
        assert tuner.measured_rel_err(choice.codec) <= limit
    assert (
        tuner.choose("all_gather", 1 << 20, torch.float32, 8, "auto:max_rel_err=0", "ring").codec
        == "none"
    )
    # a generous budget buys the smallest payload: int4 moves the fewest bytes
    generous = tuner.choose("all_gather", 1 << 20, torch.float32, 8, "auto:max_rel_err=0.5", "ring")
    assert generous.codec == "int4"


def test_the_measured_error_is_the_codecs_real_error():
    assert tuner.measured_rel_err("none") == 0
    assert 1e-3 < tuner.measured_rel_err("int8") < 2e-2 < tuner.measured_rel_err("int4") < 0.3


def test_bad_requests_are_named():
    with pytest.raises(ValueError, match="no codec of \\['int8', 'int4'\\] is within"):
        tuner.choose("all_gather", 1024, torch.float32, 4, "auto:max_rel_err=1e-4,codecs=int8+int4")
    with pytest.raises(ValueError, match="max_rel_err must be at least 0"):
        tuner.budget("auto:max_rel_err=-1")
    with pytest.raises(ValueError, match="max_rel_err must be a number"):
        tuner.budget("auto:max_rel_err=small")
    with pytest.raises(ValueError, match="options are max_rel_err=E and codecs"):
        tuner.budget("auto:speed=fast")
    with pytest.raises(ValueError, match="unknown codec 'int3'"):
        tuner.budget("auto:codecs=int3")
    with pytest.raises(ValueError, match="for all_gather and reduce_scatter"):
        tuner.choose("all_reduce", 1024, torch.float32, 4, "int8")
    with pytest.raises(ValueError, match="unknown topology"):
        tuner.configure(topology="torus")


def test_error_feedback_and_gpu_tensors_narrow_the_candidates():
    choice = tuner.choose("reduce_scatter", 1 << 20, torch.float32, 4, "int8", error_feedback=True)
    assert choice.algorithm in ("alltoall", "backend")
    tuner.configure(link="1gbit", algorithms=("multicast",))
    assert tuner.choose("all_gather", 1 << 20, torch.float32, 4, "int8").algorithm == "multicast"
    with pytest.raises(ValueError, match="no algorithm of \\['multicast'\\]"):
        tuner.choose("all_gather", 1 << 20, torch.float32, 4, "int8", on_cpu=False)


def test_each_choice_is_logged_once(caplog):
    with caplog.at_level(logging.INFO, logger="commpress.tuner"):
        for _ in range(3):
            tuner.choose("all_gather", 4096, torch.float32, 4, "int8")
    assert len([r for r in caplog.records if r.name == "commpress.tuner"]) == 1
    assert "all_gather of 4096 float32 elements on 4 ranks" in caplog.records[0].message


def test_integration_specs_accept_auto_where_the_tuner_can_choose():
    spec = CollectiveSpec.parse("auto", ("native", "ring"), "all_gather", gathers=True,
                                tunable=True)  # fmt: skip
    assert spec.tuned and spec.algorithm == "auto" and spec.codec == "auto"
    fixed = CollectiveSpec.parse("int8@auto", ("native", "ring"), "x", gathers=True, tunable=True)
    assert fixed.algorithm == "auto" and str(fixed.codec) == "int8"
    with pytest.raises(ValueError, match="'auto' is for all-gathers and reduce-scatters"):
        CollectiveSpec.parse("auto", ("native", "ring"), "codec", gathers=True)
    with pytest.raises(ValueError, match="max_rel_err must be a number"):
        CollectiveSpec.parse("auto:max_rel_err=x", ("ring",), "x", gathers=True, tunable=True)
