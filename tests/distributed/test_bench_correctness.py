"""The bench's error bounds against real collectives (gloo, 3 ranks): a correct lossy
result has no ``#wrong`` element, and a corrupted one does."""

from __future__ import annotations

import pytest
import torch

import commpress as cp
from commpress.bench import correctness
from commpress.cluster.local import run_distributed

WORLD_SIZE = 3
CHUNK = 3000  # elements per rank's chunk (all-gather: per shard)
#: Two ring pieces per chunk, whose blocks of 1000 restart at the second piece.
TWO_PIECES = cp.collectives.DEFAULT_CHUNK_BYTES // 4 + 3000
CASES = [
    ("reduce_scatter", "ring", "int8", torch.float32, CHUNK),
    ("reduce_scatter", "ring", "int8", torch.bfloat16, CHUNK),
    ("reduce_scatter", "ring", "none", torch.bfloat16, CHUNK),
    ("reduce_scatter", "alltoall", "int4", torch.float32, CHUNK),
    ("reduce_scatter", "native", "none", torch.bfloat16, CHUNK),
    ("all_reduce", "ring", "int8", torch.bfloat16, CHUNK),
    ("all_reduce", "ring-hop", "int4", torch.float32, CHUNK),
    ("all_gather", "ring-hop", "int8", torch.float16, CHUNK),
    ("reduce_scatter", "ring", "int8:block=1000", torch.float32, TWO_PIECES),
]


def _collective(op, algorithm, codec, inp):
    if op == "all_gather":
        out = inp.new_empty(WORLD_SIZE * inp.numel())
        cp.all_gather_into_tensor(out, inp, codec=codec, algorithm=algorithm)
    elif op == "reduce_scatter":
        out = inp.new_empty(inp.numel() // WORLD_SIZE)
        cp.reduce_scatter_tensor(out, inp, codec=codec, algorithm=algorithm)
    else:
        out = inp.clone()
        cp.all_reduce(out, codec=codec, algorithm=algorithm)
    return out


def _check(rank, world_size):
    results = []
    for op, algorithm, codec, dtype, chunk in CASES:
        numel = chunk if op == "all_gather" else chunk * world_size
        inputs = [correctness.bench_input(r, numel, dtype) for r in range(world_size)]
        out = _collective(op, algorithm, codec, inputs[rank])
        expected = correctness.expected(op, inputs, rank)
        bound = correctness.error_bound(op, algorithm, codec, inputs, rank)
        nudged = out.double().clone()
        nudged[7] = expected[7] + 2 * bound[7] + 1e-6
        results.append(
            {
                "case": (op, algorithm, codec, dtype, chunk),
                "numel": out.numel(),
                "wrong": correctness.count_wrong(out, expected, bound),
                "negated": correctness.count_wrong(-out, expected, bound),
                "doubled": correctness.count_wrong(out * 2, expected, bound),
                "nudged": correctness.count_wrong(nudged, expected, bound),
                "worst": ((out.double() - expected).abs() / bound).max().item(),
            }
        )
    return results


def test_bounds_hold_for_correct_results_and_catch_corrupted_ones():
    for per_rank in run_distributed(_check, WORLD_SIZE):
        for result in per_rank:
            case = result["case"]
            assert result["wrong"] == 0, case
            assert result["nudged"] == 1, case
            assert result["negated"] > result["numel"] // 2, case
            assert result["doubled"] > result["numel"] // 2, case
            # Not vacuous: the worst element uses a good part of its bound.
            assert 0.3 < result["worst"] <= 1, case


def _ring_that_writes_nothing(rank, world_size, op):
    """The bench's worker with a `ring` that returns without writing its output."""
    import commpress as cp
    from commpress.bench import collectives

    name = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}[op]
    real = getattr(cp, name)

    def broken(out, inp, codec=None, algorithm=None):
        return None if algorithm == "ring" else real(out, inp, codec=codec, algorithm=algorithm)

    setattr(cp, name, broken)
    config = dict(op=op, algorithms=["native", "ring"], codecs=["none"], begin=4096,
                  end=4096, factor=2, iters=1, warmup=0, dtypes=["float"],
                  multicast={"concurrent_roots": 2, "loss": 0.0, "seed": 0})  # fmt: skip
    return collectives._worker(rank, world_size, config)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_wrong_counts_an_output_left_unwritten(op):
    """The output was reused from the previous algorithm's call (native, right), so a
    collective that wrote nothing showed 0 wrong."""
    rows = run_distributed(_ring_that_writes_nothing, 2, op, timeout=120)[0]
    wrong = {row["algorithm"]: row["wrong"] for row in rows}
    assert wrong["native"] == 0 and wrong["ring"] > 0


def _multicast_whose_first_call_repairs(rank, world_size, warmup, iters=2):
    """The bench's worker with a `multicast` (a ring underneath) whose first call sends 100
    datagrams again and every later call none, as a cold first call's overrun receivers
    made the real one do."""
    import commpress as cp
    from commpress.bench import collectives

    real, sent_again = cp.all_gather_into_tensor, []

    def multicast(out, inp, codec=None, algorithm=None):
        if algorithm != "multicast":
            return real(out, inp, codec=codec, algorithm=algorithm)
        sent_again.append(0 if sent_again else 100)
        return real(out, inp, codec=codec, algorithm="ring")

    cp.all_gather_into_tensor = multicast
    collectives._repairs = lambda: sum(sent_again)
    config = dict(op="all_gather", algorithms=["multicast"], codecs=["none"], begin=4096,
                  end=4096, factor=2, iters=iters, warmup=warmup, dtypes=["float"],
                  multicast={"concurrent_roots": 2, "loss": 0.0, "seed": 0})  # fmt: skip
    return collectives._worker(rank, world_size, config)


@pytest.mark.parametrize("warmup", [0, 1])
def test_repairs_count_the_timed_calls_alone(warmup):
    """The repairs per call were averaged over the warm-up, the timed calls and the checked
    call, while the time and tx bytes are the timed calls': committed 64 MiB rows showed
    6786 repairs per call where every host's timed calls sent no more than without any."""
    rows = run_distributed(_multicast_whose_first_call_repairs, 2, warmup, timeout=120)[0]
    repairs = {row["algorithm"]: row["repairs"] for row in rows if "repairs" in row}
    assert repairs == {"multicast": 100 if warmup == 0 else 0}


def test_repairs_per_call_are_not_rounded_to_float32():
    """They were summed over ranks in float32: 200 over 3 calls read 66.66666412353516."""
    rows = run_distributed(_multicast_whose_first_call_repairs, 2, 0, 3, timeout=120)[0]
    (repairs,) = [row["repairs"] for row in rows if "repairs" in row]
    assert repairs == 200 / 3


def _tuner_that_chooses_by_chunk_bytes(rank, world_size):
    """The bench's worker with a tuner whose choice for a reduce-scatter depends on the
    pieces it is told the ring cuts (the collective passes its default, a re-resolve
    passed none)."""
    from commpress.bench import collectives
    from commpress.sim import tuner

    def choose(op, numel, dtype, world_size, codec, algorithm, *, chunk_bytes=None, **kwargs):
        if chunk_bytes is None:
            return tuner.Choice("alltoall", "int4", 1.0)
        return tuner.Choice("ring", "int8", 1.0)

    tuner.choose = choose
    config = dict(op="reduce_scatter", algorithms=["auto"], codecs=["none"], begin=4096,
                  end=4096, factor=2, iters=1, warmup=0, dtypes=["float"])  # fmt: skip
    return collectives._worker(rank, world_size, config)


def test_chosen_names_what_the_timed_calls_ran():
    """``chosen`` resolved the tuner's choice again with ``chunk_bytes=None`` (and no
    reduction), another call than the timed one: the column could name another choice."""
    rows = run_distributed(_tuner_that_chooses_by_chunk_bytes, 2, timeout=120)[0]
    assert {row["algorithm"]: row.get("chosen") for row in rows} == {
        "native": None,
        "auto": "int8@ring",
    }
