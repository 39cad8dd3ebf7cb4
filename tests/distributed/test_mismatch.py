"""Ranks that call a collective with different arguments all get a clear error, not a crash.

Every compressed collective checks a fingerprint of its arguments (on gloo in the headers
of its own messages, ``commpress.collectives.inband``); without it gloo kills a process
whose receive size differs, and the other rank reads garbage or a reset connection.
"""

from __future__ import annotations

import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.collectives.fingerprint import CollectiveMismatchError, Fingerprint

TIMEOUT = timedelta(seconds=10)
SENTINEL = -7.0


def _mismatched(rank, world_size, call):
    """Run ``call(rank)`` (which must raise), then a matching all-gather that must work."""
    out, error = call(rank)
    untouched = bool(out is None or torch.all(out == SENTINEL))
    inp = torch.full((8,), float(rank))
    gathered = torch.empty(8 * world_size)
    cp.all_gather_into_tensor(gathered, inp, codec="none", timeout=TIMEOUT)
    recovered = torch.equal(gathered, torch.arange(world_size).float().repeat_interleave(8))
    return error, untouched, recovered


def _every_rank_says_the_messages_differ(results):
    """Same arguments, a setting outside them that changes the messages: every rank raises
    so, leaves ``out`` as it was and recovers."""
    for rank, (error, untouched, recovered) in enumerate(results):
        assert error is not None and "their messages differ" in error, (rank, error)
        assert untouched and recovered


def _all_gather(numel_by_rank, codec_by_rank, dtype_by_rank=None):
    def call(rank):
        numel = numel_by_rank[rank]
        dtype = (dtype_by_rank or {}).get(rank, torch.float32)
        out = torch.full((numel * len(numel_by_rank),), SENTINEL, dtype=dtype)
        try:
            cp.all_gather_into_tensor(
                out, torch.ones(numel, dtype=dtype), codec=codec_by_rank[rank], timeout=TIMEOUT
            )
        except CollectiveMismatchError as error:
            return out, str(error)
        return out, None

    return call


def _sizes(rank, world_size):
    return _mismatched(rank, world_size, _all_gather({0: 1000, 1: 1200}, {0: "int8", 1: "int8"}))


def _codecs(rank, world_size):
    numel = {r: 1000 for r in range(world_size)}
    codecs = {r: "int8" for r in range(world_size)}
    codecs[world_size - 1] = "int4"
    return _mismatched(rank, world_size, _all_gather(numel, codecs))


def _dtypes(rank, world_size):
    def call(rank):
        dtype = torch.bfloat16 if rank == 1 else torch.float32
        out = torch.full((500,), SENTINEL, dtype=dtype)
        try:
            cp.reduce_scatter_tensor(
                out, torch.ones(1000, dtype=dtype), codec="int8", timeout=TIMEOUT
            )
        except CollectiveMismatchError as error:
            return out, str(error)
        return out, None

    return _mismatched(rank, world_size, call)


def _algorithms(rank, world_size):
    """Ranks on the ring send their payloads with the check in their headers; the rank on
    ``backend`` sends headers alone, and must take the ring's payloads off the wire."""

    def call(rank):
        algorithm = "backend" if rank == world_size - 1 else "ring"
        out = torch.full((3000 * world_size,), SENTINEL)
        try:
            cp.all_gather_into_tensor(
                out, torch.ones(3000), codec="int8", algorithm=algorithm, timeout=TIMEOUT
            )
        except CollectiveMismatchError as error:
            return out, str(error)
        return out, None

    return _mismatched(rank, world_size, call)


def test_a_ring_and_a_backend_rank_raise_and_the_group_stays_usable():
    results = run_distributed(_algorithms, 3, timeout=60)
    for rank, (error, untouched, recovered) in enumerate(results):
        assert error is not None, f"rank {rank} did not raise"
        assert untouched and recovered, f"rank {rank}: out written or group broken"
    assert "rank 2 called all_gather (backend)" in results[0][0]


def _long_codec(rank, world_size):
    """Found in review: a codec spec too long for the fingerprint's text field. Its rank's
    payloads must still be drained by the rank they were sent to."""

    def call(rank):
        codec = "int8:block=4096,impl=reference,stochastic=True,seed=" + "7" * 40
        out = torch.full((5000,), SENTINEL)
        try:
            cp.reduce_scatter_tensor(
                out, torch.ones(5000 * world_size), codec=codec if rank == 0 else "int8",
                timeout=TIMEOUT,
            )  # fmt: skip
        except CollectiveMismatchError as error:
            return out, str(error)
        return out, None

    return _mismatched(rank, world_size, call)


def test_a_codec_spec_longer_than_the_fingerprint_still_leaves_the_group_usable():
    results = run_distributed(_long_codec, 2, timeout=60)
    for rank, (error, untouched, recovered) in enumerate(results):
        assert error is not None, f"rank {rank} did not raise"
        assert untouched and recovered, f"rank {rank}: out written or group broken"
    assert "codec int8:block=4096" in results[1][0]


def test_different_sizes_raise_on_every_rank_naming_both_sides():
    results = run_distributed(_sizes, 2, timeout=60)
    for rank, (error, untouched, recovered) in enumerate(results):
        assert error is not None, f"rank {rank} did not raise"
        assert untouched and recovered
    assert "rank 1 called all_gather (ring) with 1200 float32 elements, codec int8" in results[0][0]
    assert "this rank: 1000 elements" in results[0][0]
    assert "rank 0 called all_gather (ring) with 1000 float32 elements" in results[1][0]
    assert "this rank: 1200 elements" in results[1][0]


def _on_a_subgroup(rank, world_size):
    """Ranks 1 and 2 of three, in a group of their own, differ in size: by a ring (the
    check in its messages) and by ``backend`` (a header alone, then a verdict)."""
    group = dist.new_group([1, 2])
    if rank == 0:
        return None
    errors = []
    for algorithm in ("ring", "backend"):
        numel = 1000 if rank == 1 else 1200
        try:
            cp.all_gather_into_tensor(
                torch.empty(2 * numel), torch.ones(numel), group, algorithm=algorithm,
                timeout=TIMEOUT,
            )  # fmt: skip
        except CollectiveMismatchError as error:
            errors.append("".join(traceback.format_exception(error)))
    return errors


def test_a_mismatch_on_a_subgroup_names_the_global_ranks_too():
    """A subgroup's ranks were named only by their rank in it ("rank 1" for the process
    launched as rank 2). The traceback is the mismatch's alone: it read "LeftDisagrees:
    the left neighbour's arguments differ. During handling of the above exception, another
    exception occurred", as if the check had failed while reporting."""
    _, first, second = run_distributed(_on_a_subgroup, 3, timeout=60)
    assert len(first) == len(second) == 2
    for error in first + second:
        assert "inband.LeftDisagrees:" not in error and "During handling" not in error, error
    for error in first:
        assert "(this is rank 0, global rank 1)" in error
        assert "rank 1 (global rank 2) called all_gather" in error
    for error in second:
        assert "(this is rank 1, global rank 2)" in error
        assert "rank 0 (global rank 1) called all_gather" in error


def test_the_global_ranks_of_several_ranks_that_differ_are_named_together():
    from commpress.collectives.fingerprint import mismatch_message

    ours = Fingerprint("all_gather", "ring", 10, "float32", "int8").to_bytes(0)
    theirs = Fingerprint("all_gather", "ring", 12, "float32", "int8").to_bytes(0)
    rows = [ours, theirs, theirs]
    message = mismatch_message(rows, 0, 3, [4, 5, 6])
    assert "(this is rank 0, global rank 4): ranks 1, 2 (global ranks 5, 6) called" in message
    assert "(this is rank 0): ranks 1, 2 called" in mismatch_message(rows, 0, 3, [0, 1, 2])


def test_different_codecs_raise_on_every_rank_of_three():
    results = run_distributed(_codecs, 3, timeout=60)
    for error, untouched, recovered in results:
        assert error is not None and untouched and recovered
    assert "rank 2 called all_gather (ring) with 1000 float32 elements, codec int4" in results[0][0]
    assert "this rank: codec int8" in results[0][0]
    assert "ranks 0, 1 called" in results[2][0]


def test_different_dtypes_of_a_reduce_scatter_are_named():
    results = run_distributed(_dtypes, 2, timeout=60)
    assert all(error is not None and recovered for error, _, recovered in results)
    assert "rank 1 called reduce_scatter (ring, sum) with 1000 bfloat16 elements" in results[0][0]
    assert "this rank: float32" in results[0][0]


def test_the_fingerprint_fits_its_fixed_size_and_reads_back():
    from commpress.collectives import fingerprint

    long_codec = "zfp:rate=16," + "x" * 300  # only its text is truncated
    row = Fingerprint("all_gather", "ring", 10, "float32", long_codec).to_bytes(3)
    assert len(row) == fingerprint.FINGERPRINT_BYTES
    parsed = fingerprint._parse(row)
    assert parsed.sequence == 3 and parsed.fingerprint.numel == 10
    assert parsed.fingerprint.codec.endswith("…")
    with pytest.raises(ValueError, match="op must be one of"):
        Fingerprint("gather", "ring", 10, "float32", "int8")


def test_codec_specs_that_differ_only_past_the_fingerprints_text_are_told_apart():
    """The text holds the start of a long codec spec; the digest of the whole text in the
    head is what tells two specs apart that differ only past its end."""
    from commpress.collectives import fingerprint

    long_codec = "zfp:rate=16," + "x" * 300
    a = Fingerprint("all_gather", "ring", 10, "float32", long_codec + "a").to_bytes(0)
    b = Fingerprint("all_gather", "ring", 10, "float32", long_codec + "b").to_bytes(0)
    assert a[fingerprint._HEAD.size :] == b[fingerprint._HEAD.size :]  # the same cut text
    assert a != b
    assert fingerprint._digests(a).tolist() != fingerprint._digests(b).tolist()
    assert "this rank: codec zfp:rate=16,xxx" in fingerprint.mismatch_message([a, b], 0, 2)


def test_a_piece_size_is_named_only_where_it_is_the_difference():
    """An all-gather has no piece size (0): beside a reduce-scatter's, "chunk_bytes=0"
    would only confuse. Between two calls of one operation and algorithm it is a
    difference, whatever else differs (here the reduction too)."""
    from commpress.collectives.fingerprint import mismatch_message

    gather = Fingerprint("all_gather", "ring", 1000, "float32", "int8")
    reduce = Fingerprint("reduce_scatter", "ring", 1000, "float32", "int8", "sum", 2 << 20)
    smaller = Fingerprint("reduce_scatter", "ring", 1000, "float32", "int8", "sum", 1 << 20)
    message = mismatch_message([gather.to_bytes(0), reduce.to_bytes(0)], 0, 2)
    assert "rank 1 called reduce_scatter (ring, sum) with 1000 float32 elements" in message
    assert "this rank: all_gather (ring)" in message
    assert "chunk_bytes" not in message
    message = mismatch_message([smaller.to_bytes(0), reduce.to_bytes(0)], 0, 2)
    assert f"chunk_bytes={2 << 20}; this rank: chunk_bytes={1 << 20}" in message
    averaged = Fingerprint("reduce_scatter", "ring", 1000, "float32", "int8", "avg", 1 << 20)
    message = mismatch_message([averaged.to_bytes(0), reduce.to_bytes(0)], 0, 2)
    assert "reduce_scatter (ring, avg)" in message and f"chunk_bytes={1 << 20}" in message


def test_the_digests_reduced_with_max_agree_only_when_every_rank_agrees():
    """What each rank all-reduces on NCCL: ``[d, -d]``; the elementwise maximum over ranks
    holds ``[max d, -min d]``, so the ranks agree exactly when the two are negations."""
    from commpress.collectives import fingerprint

    def reduced(rows):
        return torch.stack([fingerprint._digests(row) for row in rows]).amax(dim=0).tolist()

    def agree(rows):
        largest, negated_smallest = reduced(rows)
        return largest == -negated_smallest

    same = Fingerprint("all_gather", "ring", 10, "float32", "int8")
    other = Fingerprint("all_gather", "ring", 12, "float32", "int8")
    assert agree([same.to_bytes(5)] * 3)
    assert not agree([same.to_bytes(5), same.to_bytes(5), other.to_bytes(5)])
    assert not agree([same.to_bytes(5), same.to_bytes(6)])  # a skipped call
    assert all(fingerprint._digests(same.to_bytes(s))[0].item() >= 0 for s in range(100))


def _one_rank_of_four(
    rank, world_size, first_bytes=None, ignore_poison=False, early=False, split=False
):
    """Rank 2 alone calls with more elements. Only ranks 2 and 3 see a neighbour that
    differs (each rank reads its left neighbour's header); ranks 0 and 1 learn of it from
    the poison the ring carries. ``first_bytes`` cuts the first message small, so that its
    rest travels as a second message; ``early`` takes the early verdict too (its
    disagreement must keep the output held); ``split`` sends every last header alone
    (those of a disagreeing neighbour are drained by it); ``ignore_poison`` is the
    deliberately broken variant."""
    from commpress.collectives import executor, inband
    from commpress.transport import p2p

    if split:
        executor.SPLIT_LAST_BYTES = 0
    if early:  # the verdict lands at once: a release on a disagreeing verdict would show
        executor.EARLY_VERDICT_BYTES = executor.EARLY_VERDICT_MIN_RANKS = 0
        p2p.Pending.is_completed = lambda self: self.wait() or True
    if first_bytes is not None:
        inband.FIRST_MESSAGE_BYTES = first_bytes
    if ignore_poison:
        inband.Check.note = lambda self, message: None
    numel = 1200 if rank == 2 else 1000
    out = torch.full((numel * world_size,), SENTINEL)
    try:
        cp.all_gather_into_tensor(
            out, torch.ones(numel), codec="int8", timeout=timedelta(seconds=5)
        )
    except CollectiveMismatchError as error:
        outcome = str(error)
    except RuntimeError as error:  # the broken variant: a peer never joins the naming
        outcome = f"other: {error}"
    else:
        outcome = None
    untouched = bool(torch.all(out == SENTINEL))
    if ignore_poison:
        return outcome, untouched, None
    inp = torch.full((8,), float(rank))
    gathered = torch.empty(8 * world_size)
    cp.all_gather_into_tensor(gathered, inp, codec="none", timeout=TIMEOUT)
    recovered = torch.equal(gathered, torch.arange(world_size).float().repeat_interleave(8))
    return outcome, untouched, recovered


@pytest.mark.parametrize(
    "first_bytes, early, split",
    [
        (None, False, False),
        (300, False, False),
        (None, True, False),
        (None, False, True),
        (300, False, True),
    ],
    ids=["whole", "first-message-cut", "early-verdict", "last-header-alone", "cut-and-alone"],
)
def test_a_mismatch_far_from_a_rank_reaches_it_through_the_ring(first_bytes, early, split):
    results = run_distributed(_one_rank_of_four, 4, first_bytes, False, early, split, timeout=90)
    for rank, (error, untouched, recovered) in enumerate(results):
        assert error is not None and not error.startswith("other"), f"rank {rank}: {error}"
        assert untouched and recovered, f"rank {rank}: out written or group broken"
        if rank != 2:
            assert "rank 2 called all_gather (ring) with 1200 float32 elements" in error
    assert "ranks 0, 1, 3 called all_gather (ring) with 1000 float32 elements" in results[2][0]


def test_without_the_poison_the_ranks_beside_the_mismatch_would_not_know():
    """The broken variant: a rank that ignores poisoned headers returns as if all agreed."""
    results = run_distributed(_one_rank_of_four, 4, None, True, timeout=90)
    assert any(error is None for error, _, _ in results), results
    assert not all(untouched for _, untouched, _ in results)


def _early_release(rank, world_size, early_bytes, split_bytes=1 << 60):
    """An all-gather whose early verdict lands at once (``is_completed`` made to wait for
    it): the held decodes are released at the second step, not at the end, and the result
    keeps torch's bits. Returns how many decodes were held at the first release."""
    from commpress.collectives import executor, payloads
    from commpress.transport import p2p

    executor.EARLY_VERDICT_BYTES, executor.EARLY_VERDICT_MIN_RANKS = early_bytes, 0
    executor.SPLIT_LAST_BYTES = split_bytes
    p2p.Pending.is_completed = lambda self: self.wait() or True
    held_at_release, waits = [], []
    release, wait = payloads.Gathered.release, p2p.wait

    def spy(self):
        if self._held and not held_at_release:
            held_at_release.append(len(self._held))
            waits.append("release")
        release(self)

    def waiting(work, timeout):
        waits.append("wait")
        return wait(work, timeout)

    payloads.Gathered.release, p2p.wait = spy, waiting
    inp = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    out, expected = torch.empty(1000 * world_size), torch.empty(1000 * world_size)
    cp.all_gather_into_tensor(out, inp, codec="none", timeout=TIMEOUT)
    torch.distributed.all_gather_into_tensor(expected, inp)
    waits_after = len(waits) - waits.index("release") - 1 if "release" in waits else 0
    return held_at_release, torch.equal(out, expected), waits_after


def test_an_early_verdict_releases_the_output_while_the_ring_runs():
    for held, exact, _ in run_distributed(_early_release, 4, 0, timeout=60):
        assert held == [1] and exact  # only the own shard's decode was waiting
    # without it, the decodes wait for the last header; sent alone, ahead of its shard, it
    # releases the own one and two received, not the last, before the shard's receive
    # and the last send are waited
    for held, exact, waits_after in run_distributed(_early_release, 4, 1 << 40, 0, timeout=60):
        assert held == [3] and exact and waits_after >= 2
    # with neither (this output is far below both thresholds), every decode waits for the
    # end: what the assertions above would see if they were broken
    for held, exact, waits_after in run_distributed(_early_release, 4, 1 << 40, timeout=60):
        assert held == [4] and exact and waits_after == 0


def _threshold_on_one_rank(rank, world_size, setting):
    """Same arguments everywhere, but rank 0 alone sets ``executor.<setting>`` (a
    process-wide threshold) to 0: with ``EARLY_VERDICT_BYTES`` or
    ``EARLY_VERDICT_MIN_RANKS`` it alone takes an early verdict, with ``SPLIT_LAST_BYTES``
    it alone sends its last header alone. Its digest differs, so every rank raises,
    instead of waiting for a verdict only rank 0 joined, or being ended by a message of a
    size it did not expect."""
    from commpress.collectives import executor

    if setting == "EARLY_VERDICT_MIN_RANKS":  # every rank large enough for the verdict
        executor.EARLY_VERDICT_BYTES = 0
    else:  # on every rank: the threshold alone differs
        executor.EARLY_VERDICT_MIN_RANKS = 0
    same = _all_gather({r: 1000 for r in range(world_size)}, {r: "int8" for r in range(world_size)})
    default = getattr(executor, setting)

    def call(rank):
        setattr(executor, setting, 0 if rank == 0 else default)
        try:
            return same(rank)
        finally:
            setattr(executor, setting, default)

    return _mismatched(rank, world_size, call)


@pytest.mark.parametrize(
    "setting", ["EARLY_VERDICT_BYTES", "EARLY_VERDICT_MIN_RANKS", "SPLIT_LAST_BYTES"]
)
def test_ranks_that_differ_only_in_a_threshold_of_the_check_raise(setting):
    results = run_distributed(_threshold_on_one_rank, 3, setting, timeout=60)
    _every_rank_says_the_messages_differ(results)


def _transport_on_one_rank(rank, world_size, op):
    """Same arguments everywhere, but rank 0 alone posts the backend's collective point to
    point (``POINT_TO_POINT_FROM_BYTES`` 0: an ``alltoall`` reduce-scatter's all-to-all,
    or a two-rank ``backend`` all-gather), the others through gloo's own: the two never
    meet. The choice is part of the digest, so every rank raises and the group stays
    usable, instead of every rank timing out with rank 0's messages left unmatched."""
    from commpress.collectives import executor

    default = executor.POINT_TO_POINT_FROM_BYTES

    def call(rank):
        executor.POINT_TO_POINT_FROM_BYTES = 0 if rank == 0 else default
        try:
            if op == "all_gather":
                out = torch.full((1000 * world_size,), SENTINEL)
                inp = torch.ones(1000)
                cp.all_gather_into_tensor(
                    out, inp, codec="int8", algorithm="backend", timeout=TIMEOUT
                )
            else:
                out = torch.full((1000,), SENTINEL)
                inp = torch.ones(1000 * world_size)
                cp.reduce_scatter_tensor(
                    out, inp, codec="int8", algorithm="alltoall", timeout=TIMEOUT
                )
        except CollectiveMismatchError as error:
            return out, str(error)
        finally:
            executor.POINT_TO_POINT_FROM_BYTES = default
        return out, None

    return _mismatched(rank, world_size, call)


@pytest.mark.parametrize("op, world_size", [("reduce_scatter", 3), ("all_gather", 2)])
def test_ranks_that_differ_in_how_the_backends_collective_is_posted_raise(op, world_size):
    results = run_distributed(_transport_on_one_rank, world_size, op, timeout=60)
    _every_rank_says_the_messages_differ(results)


def _sizes_differ_on_one_rank(rank, world_size):
    """Same arguments everywhere, but rank 0's schedule says it sends one more message
    (patched in: no setting today changes only later message sizes, but one that did would
    leave agreeing arguments): its digest differs, so an early verdict cannot release an
    output that a later message of another size would then poison."""
    from commpress.collectives import executor
    from commpress.schedules import steps

    executor.EARLY_VERDICT_BYTES = executor.EARLY_VERDICT_MIN_RANKS = 0
    same = _all_gather({r: 1000 for r in range(world_size)}, {r: "int8" for r in range(world_size)})
    sizes = steps.Schedule.wire_sizes

    def call(rank):
        if rank == 0:
            steps.Schedule.wire_sizes = property(lambda schedule: (*sizes.func(schedule), 1))
        try:
            return same(rank)
        finally:
            steps.Schedule.wire_sizes = sizes

    return _mismatched(rank, world_size, call)


def test_the_digest_covers_the_size_of_every_message():
    _every_rank_says_the_messages_differ(run_distributed(_sizes_differ_on_one_rank, 3, timeout=60))


def _first_message_cut(rank, world_size):
    """Agreeing ranks whose first message is cut in two give the bits of torch's own."""
    from commpress.collectives import inband

    inband.FIRST_MESSAGE_BYTES = 100
    inp = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    out, expected = torch.empty(1000 * world_size), torch.empty(1000 * world_size)
    cp.all_gather_into_tensor(out, inp, codec="none", timeout=TIMEOUT)
    torch.distributed.all_gather_into_tensor(expected, inp)
    total = torch.empty(1000)  # every rank adds the same gathered values, in pieces
    cp.reduce_scatter_tensor(total, out, codec="none", chunk_bytes=512, timeout=TIMEOUT)
    own = out.view(world_size, -1)[rank]
    return torch.equal(out, expected), torch.equal(total, own * 3)  # (x + x) + x == 3x


def test_a_first_message_cut_in_two_changes_no_bit():
    results = run_distributed(_first_message_cut, 3, timeout=60)
    assert all(gathered and reduced for gathered, reduced in results), results


def _first_message_stays(rank, world_size):
    """A first message that fits the scratch buffer is received, forwarded and decoded
    there (no copy into its slot), and the results keep torch's bits."""
    from commpress.collectives import inband, payloads
    from commpress.collectives.workspace import workspace

    moved = []
    move = payloads.Slots.move

    def spy(self, chunk, piece, message):
        move(self, chunk, piece, message)
        moved.append(self.message(chunk, piece).data_ptr())

    payloads.Slots.move = spy
    inp = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    out, expected = torch.empty(1000 * world_size), torch.empty(1000 * world_size)
    cp.all_gather_into_tensor(out, inp, codec="none", timeout=TIMEOUT)
    torch.distributed.all_gather_into_tensor(expected, inp)
    total = torch.empty(1000)
    cp.reduce_scatter_tensor(total, out, codec="none", timeout=TIMEOUT)
    scratch = workspace.take("inband.first", inband.FIRST_MESSAGE_BYTES, torch.uint8, "cpu")
    own = out.view(world_size, -1)[rank]
    return moved, scratch.data_ptr(), torch.equal(out, expected), torch.equal(total, own * 3)


def test_a_first_message_that_fits_is_used_where_it_arrived():
    for moved, scratch, gathered, reduced in run_distributed(_first_message_stays, 3, timeout=60):
        assert moved == [scratch, scratch]  # the all-gather's, then the reduce-scatter's
        assert gathered and reduced


def _both_cut(rank, world_size):
    """Found in review: two ranks that disagree and both cut their first message waited
    for each other's rest before either drained (a hang until the timeout)."""
    from commpress.collectives import inband

    inband.FIRST_MESSAGE_BYTES = 300
    return _sizes(rank, world_size)


def test_two_ranks_that_both_cut_their_first_message_still_raise():
    results = run_distributed(_both_cut, 2, timeout=60)
    for rank, (error, untouched, recovered) in enumerate(results):
        assert error is not None and untouched and recovered, (rank, error)


def _windows(rank, world_size):
    """Found in review: a setting outside the fingerprint (the executor's window) that
    differs makes one rank run a chain and the other not; whether a rank runs a chain is
    part of its digest."""
    from commpress.collectives import executor

    gather = _all_gather({0: 1000, 1: 1000}, {0: "int8", 1: "int8"})

    def call(rank):
        executor.WINDOW = 2 if rank == 1 else 1
        try:
            return gather(rank)
        finally:
            executor.WINDOW = 1

    return _mismatched(rank, world_size, call)


def test_same_arguments_but_messages_of_another_size_raise_on_every_rank():
    _every_rank_says_the_messages_differ(run_distributed(_windows, 2, timeout=60))


def _not_chains(rank, world_size, algorithms):
    """Ranks whose schedules are not chains send one header and take an all-reduce's
    verdict; rank 1 (of three) calls with more elements."""
    numel = {r: 1000 for r in range(world_size)}
    numel[1] = 1200
    algorithm = algorithms[rank]

    def call(rank):
        out = torch.full((numel[rank] * world_size,), SENTINEL)
        try:
            cp.all_gather_into_tensor(
                out, torch.ones(numel[rank]), codec="int8", algorithm=algorithm, timeout=TIMEOUT
            )
        except CollectiveMismatchError as error:
            return out, str(error)
        return out, None

    return _mismatched(rank, world_size, call)


@pytest.mark.parametrize(
    "algorithms",
    [("backend", "backend", "backend"), ("backend", "backend", "ring")],
    ids=["no-chain", "two-not-chains-and-a-chain"],
)
def test_schedules_that_are_not_chains_raise_on_every_rank(algorithms):
    results = run_distributed(_not_chains, 3, algorithms, timeout=60)
    for rank, (error, untouched, recovered) in enumerate(results):
        assert error is not None and untouched and recovered, (rank, error)
    assert "rank 1 called all_gather (backend) with 1200 float32 elements" in results[0][0]


def _pieces(rank, world_size):
    """A setting outside the fingerprint that changes the chain's message sizes: the piece
    size of an all-reduce's reduce-scatter (its fingerprint carries no piece size). The
    first header's digest (which covers every message size) tells the ranks apart."""
    import importlib

    module = importlib.import_module("commpress.collectives.all_reduce")  # not the function

    def call(rank):
        default, module.DEFAULT_CHUNK_BYTES = module.DEFAULT_CHUNK_BYTES, 1024 * (rank + 1)
        tensor = torch.full((4000,), SENTINEL)
        try:
            cp.all_reduce(tensor, codec="int8", timeout=TIMEOUT)
        except CollectiveMismatchError as error:
            return tensor, str(error)
        finally:
            module.DEFAULT_CHUNK_BYTES = default
        return tensor, None

    return _mismatched(rank, world_size, call)


def test_an_all_reduce_piece_size_outside_the_fingerprint_raises_on_every_rank():
    _every_rank_says_the_messages_differ(run_distributed(_pieces, 2, timeout=60))


def _one_rank_counts_one_call_more(rank, world_size):
    """Same arguments everywhere, but rank 0 counts one checked collective more on the
    group (as if the others had skipped one): the sequence number is part of every call's
    digest, so the ring's headers disagree."""
    from commpress.collectives import fingerprint

    same = _all_gather({r: 1000 for r in range(world_size)}, {r: "int8" for r in range(world_size)})
    counts = fingerprint._sequences
    group = torch.distributed.group.WORLD

    def call(rank):
        counts[group] = counts.get(group, 0) + (rank == 0)
        try:
            return same(rank)
        finally:  # in step again for the recovering call
            counts[group] -= rank == 0

    return _mismatched(rank, world_size, call)


def test_a_rank_that_skipped_a_collective_is_named_by_the_ring():
    # fails if the in-band digest leaves the sequence number out (every rank would agree)
    results = run_distributed(_one_rank_counts_one_call_more, 3, timeout=60)
    for rank, (error, untouched, recovered) in enumerate(results):
        assert error is not None and "a rank skipped or added" in error, (rank, error)
        assert untouched and recovered


def _how_the_verdict_comes(rank, world_size, min_ranks):
    """(early verdict, last header alone) of an 8 MiB all-gather, as its check was made."""
    from commpress.collectives import executor, inband

    executor.EARLY_VERDICT_MIN_RANKS = min_ranks
    made, init = [], inband.Check.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append((self.early, self.split_last))

    inband.Check.__init__ = spy
    numel = executor.EARLY_VERDICT_BYTES // 4 // world_size
    inp = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    out, expected = torch.empty(numel * world_size), torch.empty(numel * world_size)
    cp.all_gather_into_tensor(out, inp, codec="none", timeout=TIMEOUT)
    torch.distributed.all_gather_into_tensor(expected, inp)
    return made, torch.equal(out, expected)


def test_below_the_early_verdicts_world_size_the_last_header_travels_alone():
    for made, exact in run_distributed(_how_the_verdict_comes, 4, 8, timeout=60):
        assert made == [(False, True)] and exact
    for made, exact in run_distributed(_how_the_verdict_comes, 4, 4, timeout=60):
        assert made == [(True, False)] and exact


def _alltoall_pieces(rank, world_size):
    """``alltoall`` with another piece size on the last rank: other exchanges."""

    def call(rank):
        chunk_bytes = 1024 if rank == world_size - 1 else 2048
        out = torch.full((1000,), SENTINEL)
        try:
            cp.reduce_scatter_tensor(
                out, torch.ones(1000 * world_size), codec="int8", algorithm="alltoall",
                chunk_bytes=chunk_bytes, timeout=TIMEOUT,
            )  # fmt: skip
        except CollectiveMismatchError as error:
            return out, str(error)
        return out, None

    return _mismatched(rank, world_size, call)


def test_alltoall_pieces_of_another_size_raise_naming_them():
    """``alltoall`` cuts its exchange into pieces of ``chunk_bytes``, as the ring does."""
    results = run_distributed(_alltoall_pieces, 3, timeout=60)
    for rank, (error, untouched, recovered) in enumerate(results):
        assert error is not None and untouched and recovered, (rank, error)
    assert "chunk_bytes=1024; this rank: chunk_bytes=2048" in results[0][0]


def _check_without_a_group(digest: int, split_last: bool = False):
    """An :class:`~commpress.collectives.inband.Check`'s header state alone (no group): what
    :meth:`stamp`, :meth:`accept_first` and :meth:`note` read and write."""
    from commpress.collectives import inband

    check = object.__new__(inband.Check)
    check.digest, check.poisoned, check.split_last = digest, False, split_last
    return check


def test_a_header_is_laid_out_as_documented_and_reads_back():
    """``<4s??2xQQQ``: magic, poisoned, split, two pad bytes, then digest, this message's
    bytes and the sender's next message's bytes, little-endian. A swap of two of the sizes
    on both sides reads back fine, so the bytes are checked against the layout too."""
    from commpress.collectives import inband

    check = _check_without_a_group(0x0102030405060708, split_last=True)
    check.poisoned = True
    message, following = torch.zeros(100, dtype=torch.uint8), torch.zeros(40, dtype=torch.uint8)
    check.stamp(message, following)
    raw = bytes(message[:32].tolist())
    assert raw[:4] == b"cpi2" and raw[4:6] == b"\x01\x00"  # poisoned; not split: not the last
    assert raw[8:16] == bytes([8, 7, 6, 5, 4, 3, 2, 1])
    assert int.from_bytes(raw[16:24], "little") == 100
    assert int.from_bytes(raw[24:32], "little") == 40
    assert inband.read(message) == inband.Header(0x0102030405060708, True, 100, 40, False)
    check.poisoned = False
    check.stamp(message, None)  # the last message: it says it travels split, nothing follows
    assert inband.read(message) == inband.Header(0x0102030405060708, False, 100, 0, True)
    message[:4] = torch.tensor(list(b"cpi1"), dtype=torch.uint8)  # another layout's magic
    assert inband.read(message) is None


def test_a_first_header_that_agrees_in_its_digest_but_not_its_size_is_a_disagreement():
    """The digest covers every message's size, so agreeing ranks expect the sizes sent; a
    header whose size still differs (a digest sent in place of the call's, say) is a
    disagreement, not a message to copy; a poisoned one that agrees poisons this rank."""
    from commpress.collectives import inband

    sender, receiver = _check_without_a_group(77), _check_without_a_group(77)
    scratch = torch.zeros(64, dtype=torch.uint8)
    sender.stamp(scratch[:48], None)
    with pytest.raises(inband.LeftDisagrees):
        receiver.accept_first(scratch, into=torch.empty(64, dtype=torch.uint8))
    with pytest.raises(inband.LeftDisagrees):
        _check_without_a_group(78).accept_first(scratch, into=torch.empty(48, dtype=torch.uint8))
    into = torch.empty(48, dtype=torch.uint8)
    assert receiver.accept_first(scratch, into=into) is None and not receiver.poisoned
    assert torch.equal(into, scratch[:48])
    sender.poisoned = True
    sender.stamp(scratch[:48], None)
    assert receiver.accept_first(scratch, into=torch.empty(48, dtype=torch.uint8)) is None
    assert receiver.poisoned


def test_a_later_message_of_another_size_or_magic_poisons_the_receiver():
    sender = _check_without_a_group(5)
    message = torch.zeros(48, dtype=torch.uint8)
    sender.stamp(message, None)
    receiver = _check_without_a_group(5)
    receiver.note(message)
    assert not receiver.poisoned
    receiver.note(torch.cat([message, torch.zeros(8, dtype=torch.uint8)]))  # says 48, is 56
    assert receiver.poisoned
    receiver = _check_without_a_group(5)
    message[0] = ord("x")
    receiver.note(message)
    assert receiver.poisoned
    sender.poisoned, receiver = True, _check_without_a_group(5)
    sender.stamp(message, None)
    receiver.note(message)
    assert receiver.poisoned
