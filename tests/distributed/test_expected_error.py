"""The error the tuner expects (:func:`commpress.sim.tuner.expected_rel_err`: one encode's,
grown along the schedule) against the error of the collectives themselves, on Gaussian
contributions drawn independently on each rank."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.sim import tuner

WORLD = 4
CHUNK = 1 << 15
CASES = [
    ("reduce_scatter", "ring"),
    ("reduce_scatter", "ring-hop"),
    ("reduce_scatter", "alltoall"),
    ("all_gather", "ring"),
    ("all_gather", "ring-hop"),
]
TOLERANCE = 0.05  # measured within 2.5% on 4 and 6 ranks, three seeds each


def _relative_errors(rank, world_size):
    errors = {}
    for codec in ("int8", "int4"):
        for op, algorithm in CASES:
            generator = torch.Generator().manual_seed(rank)
            if op == "reduce_scatter":
                inp, out = torch.randn(CHUNK * world_size, generator=generator), torch.empty(CHUNK)
                cp.reduce_scatter_tensor(out, inp, codec=codec, algorithm=algorithm)
                exact = inp.double()
                dist.all_reduce(exact)
                exact = exact.view(world_size, CHUNK)[rank]
            else:
                inp, out = torch.randn(CHUNK, generator=generator), torch.empty(CHUNK * world_size)
                cp.all_gather_into_tensor(out, inp, codec=codec, algorithm=algorithm)
                exact = torch.empty(CHUNK * world_size, dtype=torch.float64)
                dist.all_gather_into_tensor(exact, inp.double())
            squares = torch.stack([(out.double() - exact).norm() ** 2, exact.norm() ** 2])
            dist.all_reduce(squares)
            errors[codec, op, algorithm] = (squares[0] / squares[1]).sqrt().item()
    return errors


@pytest.fixture(scope="module")
def measured():
    return run_distributed(_relative_errors, WORLD, timeout=300)[0]


@pytest.mark.parametrize("codec", ["int8", "int4"])
@pytest.mark.parametrize(("op", "algorithm"), CASES)
def test_the_expected_error_is_the_collectives_error(measured, codec, op, algorithm):
    expected = tuner.expected_rel_err(codec, op, algorithm, WORLD)
    assert measured[codec, op, algorithm] == pytest.approx(expected, rel=TOLERANCE)


def test_one_encodes_error_would_not_pass(measured):
    """The broken variant: the error of one encode, as the tuner judged before, misses the
    ring reduce-scatter's (it re-encodes at every hop) and the all-to-all's (the own
    contribution is exact) by more than the tolerance."""
    for codec in ("int8", "int4"):
        one_encode = tuner.measured_rel_err(codec)
        for algorithm in ("ring", "alltoall"):
            actual = measured[codec, "reduce_scatter", algorithm]
            assert actual != pytest.approx(one_encode, rel=TOLERANCE)
