"""``algorithm="auto"`` runs what the tuner chose, on every rank alike."""

from __future__ import annotations

import pytest
import torch

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.collectives import auto
from commpress.collectives.fingerprint import CollectiveMismatchError
from commpress.sim import tuner
from commpress.testing.silence import CommunicationAttempted, forbid_communication


def _auto_against_the_choice(rank, world_size):
    tuner.configure(link="1gbit")
    results = []
    for numel in (96, 1 << 16):
        generator = torch.Generator().manual_seed(rank)
        shard = torch.randn(numel, generator=generator)
        whole = torch.randn(numel * world_size, generator=generator)
        gathered, expected = torch.empty(numel * world_size), torch.empty(numel * world_size)
        cp.all_gather_into_tensor(gathered, shard, codec="int8", algorithm="auto")
        chosen = tuner.choose("all_gather", numel, torch.float32, world_size, "int8")
        cp.all_gather_into_tensor(expected, shard, codec=chosen.codec, algorithm=chosen.algorithm)
        reduced, reference = torch.empty(numel), torch.empty(numel)
        cp.reduce_scatter_tensor(reduced, whole, codec="auto:max_rel_err=1e-2", algorithm="auto")
        picked = tuner.choose("reduce_scatter", whole.numel(), torch.float32, world_size,
                              "auto:max_rel_err=1e-2")  # fmt: skip
        cp.reduce_scatter_tensor(reference, whole, codec=picked.codec, algorithm=picked.algorithm)
        results.append((torch.equal(gathered, expected), torch.equal(reduced, reference),
                        str(chosen), str(picked), gathered))  # fmt: skip
    return results, _placements()


def _placements():
    """Where the tuner puts the world, a subgroup of ranks 0 and 2 (on its members), and a
    subgroup of every rank in order."""
    strided = torch.distributed.new_group([0, 2])
    every = torch.distributed.new_group([0, 1, 2])
    mine = auto.placement(strided) if torch.distributed.get_rank() != 1 else "outside"
    asked = []  # what a reduce-scatter on the strided group asks the tuner
    choose, tuner.choose = (
        tuner.choose,
        lambda *args, **kwargs: asked.append(kwargs) or (choose(*args, **kwargs)),
    )
    try:
        if torch.distributed.get_rank() != 1:
            out, inp = torch.empty(8), torch.ones(16)
            cp.reduce_scatter_tensor(out, inp, group=strided, algorithm="auto", chunk_bytes=1024)
    finally:
        tuner.choose = choose
    passed = [(kwargs["placement"], kwargs["chunk_bytes"]) for kwargs in asked]
    return auto.placement(None), mine, auto.placement(every), passed


def test_auto_runs_the_tuners_choice_and_every_rank_agrees_and_places_subgroups():
    by_rank, placements = zip(
        *run_distributed(_auto_against_the_choice, 3, timeout=120), strict=True
    )
    strided = tuner.Placement(hosts=(0, 2), network_hosts=3)
    asked = [(strided, 1024)]  # by the call that runs on the subgroup
    assert placements == (
        (None, strided, None, asked),
        (None, "outside", None, []),
        (None, strided, None, asked),
    )
    for size in range(2):
        choices = {(r[size][2], r[size][3]) for r in by_rank}
        assert len(choices) == 1, choices
        for rank_results in by_rank:
            same_gather, same_reduce, _, _, gathered = rank_results[size]
            assert same_gather and same_reduce
            assert torch.equal(gathered, by_rank[0][size][4])


def _outcome(call):
    try:
        call()
    except (ValueError, TypeError, CollectiveMismatchError) as error:
        return f"{type(error).__name__}: {error}"
    return "ran"


def _ranks_told_different_things(rank, world_size):
    """Each rank is given its own settings; an asynchronous compressed collective is still
    queued on the group when each tuned call resolves."""
    import os

    from commpress.transport import multicast

    tuner.configure(link="1gbit", algorithms=("native", "multicast"))

    def gather(numel):
        shard = torch.full((numel,), float(rank))
        exact = torch.arange(world_size, dtype=torch.float32).repeat_interleave(numel)
        out = torch.empty(numel * world_size)
        queued = cp.all_gather_into_tensor(out, shard, codec="none", async_op=True)
        gathered = torch.empty(numel * world_size)
        try:
            cp.all_gather_into_tensor(gathered, shard, codec="int8", algorithm="auto")
        finally:
            queued.wait()
        assert torch.equal(out, exact) and torch.equal(gathered, exact)

    outcomes = {}
    # both choose native at these paces (a multicast at 1-2 Mbit/s is slow): they agree
    os.environ[multicast.ENVIRONMENT] = f"rate={rank + 1}mbit"
    outcomes["same choice"] = _outcome(lambda: gather(1024))
    os.environ[multicast.ENVIRONMENT] = "roots=many"  # read at a call's first resolution
    outcomes["same choice again"] = _outcome(lambda: gather(1024))
    # rank 0 chooses native; rank 1, whose options cannot be read, multicast at the link
    os.environ[multicast.ENVIRONMENT] = "rate=1mbit" if rank == 0 else "roots=many"
    outcomes["multicast options"] = _outcome(lambda: gather(2048))
    os.environ[multicast.ENVIRONMENT] = "rate=1mbit"
    tuner.configure(link="1gbit", algorithms=("native",) if rank == 0 else ("ring",))
    outcomes["algorithms"] = _outcome(lambda: gather(1024))
    tuner.configure(link="1gbit", algorithms=("native", "ring") if rank == 0 else ("multicast",))
    whole, reduced = torch.ones(2048), torch.empty(1024)
    outcomes["no choice"] = _outcome(
        lambda: cp.reduce_scatter_tensor(reduced, whole, codec="int8", algorithm="auto")
    )
    tuner.configure(link="1gbit", algorithms=("native",))
    shard = torch.ones(512 * (rank + 1))  # torch's all-gather of two sizes: gloo ends one
    outcomes["arguments"] = _outcome(
        lambda: cp.all_gather_into_tensor(torch.empty(2 * shard.numel()), shard, algorithm="auto")
    )
    tuner.configure(link="1gbit")
    outcomes["after"] = _outcome(lambda: gather(1024))
    return outcomes


def test_ranks_whose_tuners_choose_differently_all_raise_naming_what_differs():
    """A rank that chose native ran torch's collective unchecked while its peer ran
    another: a timeout, or gloo ending a rank. Now the first call of each key exchanges the
    choices, behind the collectives queued before it, and every rank raises."""
    by_rank = run_distributed(_ranks_told_different_things, 2, timeout=120)
    for outcomes in by_rank:
        assert outcomes["same choice"] == outcomes["same choice again"] == "ran", outcomes
        assert outcomes["after"] == "ran", outcomes
        options = outcomes["multicast options"]
        assert "chose differently (rank 0: none@native; rank 1: int8@multicast)" in options
        assert "multicast options (rank 0: Options(rate_bits=1000000" in options
        assert "rank 1: unreadable (COMMPRESS_MULTICAST: " in options
        assert "tuner network" not in options
        algorithms = outcomes["algorithms"]
        assert "these differ: tuner network (rank 0: Network(" in algorithms
        assert "algorithms=('native',)" in algorithms and "algorithms=('ring',)" in algorithms
        assert "not every rank's tuner could choose (rank 0: chose " in outcomes["no choice"]
        assert "rank 1: no algorithm of [] runs reduce_scatter" in outcomes["no choice"]
        arguments = outcomes["arguments"]
        assert arguments.startswith("CollectiveMismatchError: ranks called a tuned collective")
        assert "rank 0: all_gather of 512 float32 elements on cpu" in arguments
        assert "rank 1: all_gather of 1024 float32 elements on cpu" in arguments
    assert by_rank[0] == by_rank[1] | {"arguments": by_rank[0]["arguments"]}


def _options_set_on_a_subgroup(rank, world_size):
    from commpress.transport import multicast

    tuner.configure(link="1gbit", algorithms=("native", "multicast"))
    multicast.set_default_options(multicast.Options(rate_bits=10**6))  # native wins
    pair = torch.distributed.new_group([0, 1])
    shard, out = torch.ones(256), torch.empty(256 * world_size)
    cp.all_gather_into_tensor(out, shard, codec="int8", algorithm="auto")
    if rank < 2:  # on the pair's ranks alone, as new_group's members configure it
        multicast.configure(pair, rate_bits=2 * 10**6)
        cp.all_gather_into_tensor(torch.empty(512), shard, pair, codec="int8", algorithm="auto")
    cp.all_gather_into_tensor(out, shard, codec="int8", algorithm="auto")  # agreed before
    return out.tolist() == [1.0] * out.numel()


def test_options_set_on_a_subgroup_leave_the_other_groups_choices_agreed():
    """Whether a call exchanges must not depend on settings a rank alone was given: the
    pair's new options made its ranks exchange again on the world, and the third hang."""
    assert run_distributed(_options_set_on_a_subgroup, 3, timeout=60) == [True] * 3


def _tuned_on_a_subgroup(rank, world_size):
    """Ranks 1 and 2 of three, in a group of their own, call a tuned all-gather with
    shards of different sizes."""
    import torch.distributed as dist

    group = dist.new_group([1, 2])
    if rank == 0:
        return None
    shard = torch.ones(512 * rank)
    return _outcome(
        lambda: cp.all_gather_into_tensor(
            torch.empty(2 * shard.numel()), shard, group, algorithm="auto"
        )
    )


def test_a_tuned_call_that_differs_on_a_subgroup_names_the_global_ranks_too():
    """The ranks were named only by their rank in the subgroup."""
    _, first, second = run_distributed(_tuned_on_a_subgroup, 3, timeout=120)
    assert first == second.replace("rank 1, global rank 2)", "rank 0, global rank 1)")
    assert first.startswith(
        "CollectiveMismatchError: ranks called a tuned collective with different arguments "
        "(this is rank 0, global rank 1): rank 0 (global rank 1): "
    ), first
    assert "; rank 1 (global rank 2): " in first


def _bad_tuned_calls(rank, world_size):
    """Each bad tuned call's error, and the torch.distributed operations it attempted (the
    guard refuses every one, so that an agreement moved to another primitive is seen)."""
    outcomes = []
    calls = (
        lambda: cp.reduce_scatter_tensor(
            torch.empty(8), torch.ones(16), algorithm="auto", residual=torch.zeros(3)
        ),
        lambda: cp.all_gather_into_tensor(
            torch.empty(16, device="meta"), torch.empty(8, device="meta"), algorithm="auto"
        ),
    )
    for call in calls:
        with forbid_communication() as attempted:
            outcome = _guarded_outcome(call)
        outcomes.append((outcome, attempted))
    return outcomes


def _guarded_outcome(call):
    try:
        return _outcome(call)
    except CommunicationAttempted as error:
        return f"communicated: {error}"


def test_a_bad_tuned_call_raises_before_the_tuner_exchanges_its_choice():
    """The tuner agrees on its choice over the group: a residual of the wrong size, or a
    device the group moves no tensors of, must be refused before that communication."""
    for outcomes in run_distributed(_bad_tuned_calls, 2, timeout=60):
        (residual, residual_attempts), (meta, meta_attempts) = outcomes
        assert "residual must be a contiguous float32 tensor" in residual, residual
        assert "inp is on meta" in meta, meta
        assert residual_attempts == meta_attempts == []


def _told_the_same_again(rank, world_size):
    tuner.configure(link="1gbit", algorithms=("native", "ring"))
    shard, out = torch.full((256,), float(rank)), torch.empty(256 * world_size)
    cp.all_gather_into_tensor(out, shard, codec="int8", algorithm="auto")
    if rank == 0:  # the same values, on one rank: nothing its peers need to hear of
        tuner.configure(link="1gbit", algorithms=("native", "ring"))
    cp.all_gather_into_tensor(out, shard, codec="int8", algorithm="auto")
    return out.tolist() == [float(r) for r in range(world_size) for _ in range(256)]


def test_a_rank_told_the_same_settings_again_keeps_the_agreed_choices():
    """The agreed choices were dropped each time ``tuner.configure`` ran: on the one rank
    that ran it the next call exchanged its choice again, against its peer's all-gather."""
    assert run_distributed(_told_the_same_again, 2, timeout=30) == [True, True]


def _reduce_ops_that_differ(rank, world_size):
    import torch.distributed as dist

    tuner.configure(link="1gbit", algorithms=("native",))
    op = dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.AVG
    out = torch.empty(4)
    return _outcome(lambda: cp.reduce_scatter_tensor(out, torch.ones(8), op, algorithm="auto"))


def test_a_tuned_reduce_scatter_with_another_op_on_each_rank_raises_on_every_rank():
    """The op was not exchanged: with native chosen, rank 0 summed and rank 1 averaged,
    and each went on with its own result."""
    for outcome in run_distributed(_reduce_ops_that_differ, 2, timeout=60):
        assert outcome.startswith("CollectiveMismatchError: ranks called a tuned collective")
        assert "op=SUM" in outcome and "op=AVG" in outcome, outcome


def _many_call_shapes(rank, world_size):
    """Which of a sequence of tuned all-gathers exchanged, with two choices kept."""

    tuner.configure(link="1gbit", algorithms=("native",))
    auto.KEPT_CHOICES = 2
    exchanged = []
    gather_objects = auto.all_gather_objects

    def counted(*args, **kwargs):
        exchanged[-1] = True
        return gather_objects(*args, **kwargs)

    auto.all_gather_objects = counted
    for numel in (1, 2, 1, 3, 1, 2):  # 3 drops 2, the least recently used; then 2 drops 3
        exchanged.append(False)
        shard = torch.full((numel,), float(rank))
        cp.all_gather_into_tensor(torch.empty(numel * world_size), shard, algorithm="auto")
    kept = [call.numel for call in auto._agreed_on(None)]
    return exchanged, kept


def test_a_group_keeps_a_bounded_number_of_agreed_choices_and_every_rank_drops_the_same():
    """Every distinct call shape's choice was kept for the group's lifetime."""
    for exchanged, kept in run_distributed(_many_call_shapes, 2, timeout=60):
        assert exchanged == [True, True, False, True, False, True]
        assert kept == [1, 2]


def _fixed_codecs_on_dtypes_they_cannot_take(rank, world_size, peer_dtype):
    """A tuned all-gather of float64 with codec none and with int8, a reduction of float64 with int8
    (which only native may run), and an all-gather whose dtype differs by rank."""
    from datetime import timedelta

    tuner.configure(link="1gbit")
    shard, whole = torch.full((4,), float(rank), dtype=torch.float64), torch.ones(4 * world_size)
    gathered, reduced = torch.empty(4 * world_size, dtype=torch.float64), torch.empty(4)
    gather = _outcome(
        lambda: cp.all_gather_into_tensor(gathered, shard, codec="none", algorithm="auto")
    )
    refused = _outcome(
        lambda: cp.all_gather_into_tensor(gathered, shard, codec="int8", algorithm="auto")
    )
    summed = _outcome(
        lambda: cp.reduce_scatter_tensor(
            reduced.double(), whole.double(), codec="int8", algorithm="auto"
        )
    )
    mine = torch.float64 if rank == 0 else peer_dtype
    apart = _outcome(
        lambda: cp.all_gather_into_tensor(
            torch.empty(8 * world_size, dtype=mine), torch.ones(8, dtype=mine), codec="int8",
            algorithm="auto", timeout=timedelta(seconds=5),
        )
    )  # fmt: skip
    return gather, refused, summed, apart


def test_a_fixed_codec_that_cannot_take_the_dtype_is_refused_alike_on_every_rank_and_alone():
    """An all-gather of float64 given codec int8 raised the tuner's 'cannot take
    dtype=torch.float64' (no argument named) on 2 ranks, before the exchange: a peer whose
    dtype int8 takes waited there until the timeout; alone it ran native, the codec
    ignored. Now the error of an explicit algorithm's, agreed on. A reduction of float64,
    which only native may run, takes the codec as torch does: not at all."""
    refusal = (
        "TypeError: codec 'int8' cannot take inp.dtype=torch.float64; it handles float32, "
        "bfloat16, float16"
    )
    for world_size in (1, 2):
        for gather, refused, summed, apart in run_distributed(
            _fixed_codecs_on_dtypes_they_cannot_take, world_size, torch.float32, timeout=60
        ):
            assert gather == "ran", gather
            assert refused.startswith(refusal), refused
            assert summed == "ran", summed
            if world_size == 1:
                assert apart.startswith(refusal), apart
            else:
                assert apart.startswith("CollectiveMismatchError: ranks called a tuned"), apart


def _fed_back_alone(rank, world_size):
    inp = torch.linspace(-1, 1, 64)
    results = []
    for algorithm in ("auto", "alltoall"):
        out, residual = torch.empty(64), torch.zeros(64)
        cp.reduce_scatter_tensor(out, inp, algorithm=algorithm, residual=residual)
        results.append((out, residual))
    return results


def test_a_tuned_reduction_with_error_feedback_runs_alone():
    """Alone the tuner gave it to native, which raised that a residual needs 'alltoall'
    or 'backend' (an algorithm the caller had not given); on 2 ranks it ran."""
    ((tuned, fixed),) = run_distributed(_fed_back_alone, 1, timeout=60)
    assert torch.equal(tuned[0], fixed[0]) and torch.equal(tuned[1], fixed[1])


def _a_kept_choice_against_a_first_call(rank, world_size, agreement):
    """Per case: every rank makes a tuned call of one shape (its choice agreed and kept),
    then the ranks in ``keepers`` call that shape again while the others call another:
    what each rank got (a mismatch, not the timeout), and whether the kept shape runs
    right after."""
    from datetime import timedelta

    if agreement:  # the check of CUDA tensors and NCCL groups, here on gloo's CPU tensors
        from commpress.collectives import inband

        inband.applies = lambda group, device: False
    tuner.configure(link="1gbit")
    timeout = timedelta(seconds=5)

    def gather(numel):
        out = torch.empty(numel * world_size)
        shard = torch.full((numel,), float(rank))
        cp.all_gather_into_tensor(out, shard, algorithm="auto", timeout=timeout)
        return torch.equal(out, torch.arange(world_size).float().repeat_interleave(numel))

    def scatter(numel):
        out = torch.empty(numel)
        whole = torch.ones(numel * world_size)
        cp.reduce_scatter_tensor(out, whole, algorithm="auto", timeout=timeout)
        return bool((out - world_size).abs().max() < 0.1)

    others = set(range(1, world_size))
    cases = [(gather, {0}), (gather, others), (scatter, {0}), (scatter, others)]
    results = []
    for index, (call, keepers) in enumerate(cases):
        kept = 256 * (index + 1)
        call(kept)
        outcome = _outcome(lambda: call(kept if rank in keepers else kept + 8))  # noqa: B023
        results.append((outcome, call(kept)))
    return results


@pytest.mark.parametrize(
    ("world_size", "agreement"), [(2, False), (3, False), (3, True)], ids=["2", "3", "3-agreement"]
)
def test_a_rank_that_kept_a_choice_against_a_peer_that_exchanges_raises_on_every_rank(
    world_size, agreement
):
    """A rank whose choice for a call was kept ran its collective at once, while a peer
    whose call had another shape exchanged the tuner's choices: both timed out, and the
    group was unusable. Now the exchange opens as a checked collective, and every rank
    raises CollectiveMismatchError at once, the group usable after."""
    by_rank = run_distributed(_a_kept_choice_against_a_first_call, world_size, agreement,
                              timeout=60)  # fmt: skip
    for rank, results in enumerate(by_rank):
        for case, (outcome, after) in enumerate(results):
            keeps = rank == 0 if case % 2 == 0 else rank != 0
            said = (case, rank, outcome)
            assert outcome.startswith(
                f"CollectiveMismatchError: ranks of a group of {world_size} called a "
                f"collective with different arguments (this is rank {rank}): "
            ), said
            op = "all_gather" if case < 2 else "reduce_scatter"
            auto_side = f"{op} (auto" + ("" if case < 2 else ", sum")
            elements = 256 * (case + 1) * (1 if case < 2 else world_size)
            extra = 8 * (1 if case < 2 else world_size)
            if keeps:  # its peers' call is named as auto, its own as what it ran
                assert f"called {auto_side}) with {elements + extra} float32 " in outcome, said
                assert f"; this rank: {op} (" in outcome, said
                assert f"; this rank: {op} (auto" not in outcome, said
            else:
                assert f") with {elements} float32 elements" in outcome, said
                assert f"; this rank: {auto_side})" in outcome, said
            assert after, said
