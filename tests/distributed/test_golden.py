"""The single executor changed no bit: every algorithm's outputs on fixed inputs, on every
rank, against SHA-256 digests written by the collectives as they were before it
(``golden.py`` documents how the file was made)."""

from __future__ import annotations

import json

import golden
import pytest


@pytest.fixture(scope="module")
def saved() -> dict[str, list[str]]:
    return json.loads(golden.GOLDEN.read_text())


@pytest.fixture(scope="module")
def computed() -> dict[str, list[str]]:
    return golden.compute()


def test_every_case_has_saved_outputs(saved, computed):
    assert sorted(computed) == sorted(saved)
    assert len(saved) > 200


@pytest.mark.parametrize("world_size", golden.WORLD_SIZES)
def test_outputs_are_bitwise_the_same_as_before(saved, computed, world_size):
    names = [name for name in saved if name.endswith(f"n={world_size}")]
    changed = [name for name in names if computed[name] != saved[name]]
    assert not changed, f"{len(changed)} of {len(names)} cases changed, e.g. {changed[:3]}"


def test_several_steps_in_flight_change_no_bit(saved):
    """The executor handles arrivals in step order whatever its window: with three steps
    in flight (the ring reduce-scatter has four pieces per chunk here), the same bits."""
    wide = golden.compute(world_sizes=(3,), window=3)
    changed = [name for name, digests in wide.items() if digests != saved[name]]
    assert not changed, f"{len(changed)} cases changed, e.g. {changed[:3]}"


def test_backend_gives_the_bits_of_ring_and_alltoall(saved):
    """``backend`` (new with the executor, so it has no digests of its own) encodes each
    shard once, like ``ring``, and its reduce-scatter is the all-to-all of ``alltoall``."""
    twins = {"all_gather": "ring", "reduce_scatter": "alltoall", "all_reduce": "alltoall"}
    # Stochastic rounding is left out: its noise depends on the calls before it.
    cases = [
        c
        for c in golden.cases()
        if c[1] == twins[c[0].partition("/")[0]] and "stochastic" not in c[2]
    ]
    computed = golden.compute(world_sizes=(3,), algorithm="backend", cases=cases)
    for name, digests in computed.items():
        assert digests == saved[name], name
