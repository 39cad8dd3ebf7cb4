"""The schedules alone, without a process group: every rank's schedule of one call run in
lock step by a small simulator that moves labels instead of tensors.

An all-gather moves chunk labels: every rank must end with every chunk exactly once. A
reduction moves the multiset of ranks whose contribution a partial sum holds: every rank
must end with each rank's contribution to its own chunk exactly once, over pieces that
tile the chunk. The byte counts are checked against the textbook formulas.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter, defaultdict

import pytest
import torch

from commpress.codecs import get_codec
from commpress.schedules import (
    NATIVE,
    Prepare,
    Schedule,
    Step,
    Then,
    Transport,
    plan,
    wire_bytes,
)

WORLDS = (1, 2, 3, 4, 5, 8, 16, 33, 64)
CODECS = ("none", "int8")
DTYPES = (torch.float32, torch.bfloat16)
CHUNK_BYTES = 512  # pieces of 128 fp32 elements: the ring reduce-scatter has several
PIECE = CHUNK_BYTES // 4
SHARD = 300  # elements of an all-gather's shard: three pieces, the last one shorter
GATHERS = ("ring", "ring-hop", "backend", "multicast")
REDUCTIONS = ("ring", "ring-hop", "alltoall", "backend")
#: The all-gather that finishes each algorithm's all-reduce.
ALL_REDUCE_GATHER = {
    "ring": "ring",
    "ring-hop": "ring-hop",
    "alltoall": "ring",
    "backend": "backend",
}
GATHER_THEN = (Then.DECODE, Then.DECODE_REENCODE)


def reduction_numel(world_size: int) -> int:
    """A whole tensor that does not divide: chunks of 301 to 304 elements, three pieces."""
    return 300 * world_size + 7


@functools.lru_cache(maxsize=8)  # an all-reduce reads both schedules of a call
def schedules_of(op, algorithm, world_size, numel, dtype, codec) -> tuple[tuple[Schedule, ...]]:
    """Per rank, the schedules of one call, in order."""
    return tuple(
        plan(op, algorithm, rank, world_size, numel, dtype, codec, CHUNK_BYTES)
        for rank in range(world_size)
    )


def nth(op, algorithm, world_size, numel, dtype, codec, index) -> list[Schedule]:
    """Every rank's ``index``-th schedule (all-reduce: 0 reduce-scatter, 1 all-gather)."""
    return [ranks[index] for ranks in schedules_of(op, algorithm, world_size, numel, dtype, codec)]


# ---------------------------------------------------------------- the simulator


def check_structure(schedules: list[Schedule]) -> None:
    """What holds for any schedule: the ranks agree on the call and on the number of steps;
    no rank sends to or receives from itself or a rank outside the world; every slice lies
    in the chunk and carries the bytes the codec gives its size; the transport's shape."""
    n = len(schedules)
    first = schedules[0]
    for rank, schedule in enumerate(schedules):
        assert (schedule.rank, schedule.world_size) == (rank, n)
        shared = ("op", "algorithm", "codec", "chunk_numel", "payload_dtype", "transport")
        assert all(getattr(schedule, name) == getattr(first, name) for name in shared), rank
        rounds = [step.round for step in schedule.steps]
        assert rounds == [step.round for step in first.steps], f"rank {rank}: not in lock step"
        assert rounds == sorted(rounds), f"rank {rank}: rounds out of order"
        wire = functools.cache(
            functools.partial(
                _wire_bytes, get_codec(schedule.codec), getattr(torch, schedule.payload_dtype)
            )
        )
        others = tuple(peer for peer in range(n) if peer != rank)
        for index, step in enumerate(schedule.steps):
            where = f"rank {rank} step {index}"
            for send in step.sends:
                assert send.dsts, f"{where}: a send to nobody"
                assert len(set(send.dsts)) == len(send.dsts), f"{where}: {send.dsts}"
                assert all(0 <= peer < n for peer in send.dsts), f"{where}: sends to {send.dsts}"
                assert rank not in send.dsts, f"{where}: sends to itself"
            for receive in step.receives:
                assert 0 <= receive.src < n, f"{where}: receives from {receive.src}"
                assert receive.src != rank, f"{where}: receives from itself"
            for item in step.sends + step.receives:
                assert 0 <= item.chunk < n, f"{where}: chunk {item.chunk}"
                assert item.offset >= 0 and item.offset + item.numel <= schedule.chunk_numel
                assert item.wire_bytes == wire(item.numel), where
            if schedule.transport is Transport.ALL_GATHER:
                # the backend's all-gather: one payload to every other rank, one from each
                assert [send.dsts for send in step.sends] == [others], where
                assert sorted(receive.src for receive in step.receives) == list(others), where
            elif schedule.transport is Transport.MULTICAST:
                # one broadcast per step: its root sends once to every other rank
                roots = {send.chunk for send in step.sends} | {r.src for r in step.receives}
                assert len(roots) == 1, f"{where}: roots {roots}"
                if step.sends:
                    assert [send.dsts for send in step.sends] == [others], where
                else:
                    assert len(step.receives) == 1, where
            elif schedule.transport is Transport.ALL_TO_ALL:
                # the backend's all-to-all: at most one payload per peer each way
                dsts = [dst for send in step.sends for dst in send.dsts]
                srcs = [receive.src for receive in step.receives]
                assert len(set(dsts)) == len(dsts) and len(set(srcs)) == len(srcs), where


def _wire_bytes(codec, dtype, numel: int) -> int:
    return codec.wire_bytes(numel, dtype)


def _key(item) -> tuple:
    return (item.chunk, item.piece, item.offset, item.numel, item.wire_bytes)


def run_lock_step(schedules: list[Schedule], payload, deliver) -> None:
    """Step ``i`` of every rank together. A step's sends and receives are posted at once,
    so every payload is taken (``payload(rank, send)``) from the state before the step;
    then every send to ``d`` must meet exactly one receive at ``d`` naming the sender and
    the same chunk, piece, slice and bytes, and ``deliver(rank, receive, payload)`` runs."""
    check_structure(schedules)
    for index in range(len(schedules[0].steps)):
        in_flight: dict[tuple, list] = defaultdict(list)
        for rank, schedule in enumerate(schedules):
            for send in schedule.steps[index].sends:
                value = payload(rank, send)
                for dst in send.dsts:
                    in_flight[(rank, dst, *_key(send))].append(value)
        sent = Counter({message: len(values) for message, values in in_flight.items()})
        received = Counter(
            (receive.src, rank, *_key(receive))
            for rank, schedule in enumerate(schedules)
            for receive in schedule.steps[index].receives
        )
        assert sent == received, (
            f"step {index}: (src, dst, chunk, piece, offset, numel, bytes) sent but not "
            f"received: {dict(sent - received)}; received but not sent: {dict(received - sent)}"
        )
        for rank, schedule in enumerate(schedules):
            for receive in schedule.steps[index].receives:
                deliver(rank, receive, in_flight[(receive.src, rank, *_key(receive))].pop(0))


def assert_tiles(slices, numel: int, where: str) -> None:
    """The ``(offset, numel)`` slices cover ``[0, numel)`` once: no gap, no overlap."""
    end = 0
    for offset, size in sorted(slices):
        assert offset == end, f"{where}: pieces leave a gap or overlap at element {offset}"
        end = offset + size
    assert end == numel, f"{where}: pieces cover [0, {end}) of [0, {numel})"


def simulate_all_gather(schedules: list[Schedule], own_values=None) -> list[dict]:
    """Every rank's chunks at the end, chunk -> value (default value: the owner's rank).

    A rank has its own chunk from its input; every other chunk it must receive, each piece
    exactly once, the pieces tiling the chunk. It encodes only its own chunk, each piece
    once, and forwards only pieces it has received in an earlier step."""
    n = len(schedules)
    values = [{rank: rank if own_values is None else own_values[rank]} for rank in range(n)]
    arrived = [Counter() for _ in range(n)]  # (chunk, piece) -> copies received
    cuts = [{} for _ in range(n)]  # (chunk, piece) -> (offset, numel)
    encoded = [Counter() for _ in range(n)]  # (offset, numel) of each own piece encoded

    def payload(rank, send):
        if send.prepare is Prepare.ENCODE:
            assert send.chunk == rank, f"rank {rank} encodes chunk {send.chunk}, not its own"
            encoded[rank][(send.offset, send.numel)] += 1
        else:
            assert arrived[rank][(send.chunk, send.piece)], (
                f"rank {rank} forwards chunk {send.chunk} piece {send.piece} before it has "
                f"received it"
            )
        return values[rank][send.chunk]

    def deliver(rank, receive, value):
        assert receive.then in GATHER_THEN, f"rank {rank}: {receive.then} in an all-gather"
        key = (receive.chunk, receive.piece)
        assert cuts[rank].setdefault(key, (receive.offset, receive.numel)) == (
            receive.offset,
            receive.numel,
        ), f"rank {rank}: {key} arrives as two different slices"
        arrived[rank][key] += 1
        held = values[rank].setdefault(receive.chunk, value)
        assert held is value or held == value, f"rank {rank}: two values of {receive.chunk}"

    run_lock_step(schedules, payload, deliver)
    for rank, schedule in enumerate(schedules):
        chunks = {chunk for chunk, _ in arrived[rank]}
        others = set(range(n)) - {rank}
        assert chunks == others, (
            f"rank {rank}: chunks missing {sorted(others - chunks)}, "
            f"received but its own or out of range: {sorted(chunks - others)}"
        )
        repeated = {key: copies for key, copies in arrived[rank].items() if copies > 1}
        assert not repeated, f"rank {rank}: (chunk, piece) received more than once {repeated}"
        slices_of = defaultdict(list)
        for (chunk, _), cut in cuts[rank].items():
            slices_of[chunk].append(cut)
        for chunk in others:
            assert_tiles(slices_of[chunk], schedule.chunk_numel, f"rank {rank} chunk {chunk}")
        if n > 1:
            repeated = {cut: times for cut, times in encoded[rank].items() if times > 1}
            assert not repeated, f"rank {rank} encodes its pieces more than once: {repeated}"
            assert_tiles(encoded[rank], schedule.chunk_numel, f"rank {rank} encodes")
        else:
            assert not encoded[rank]
    return values


#: A multiset of ranks as one int, a digit of this many bits per rank: adding two is one
#: addition however many ranks (a Counter's costs one step per rank, which at 64 ranks was
#: most of this file's time).
_DIGIT_BITS = 16


def _contribution(rank: int) -> int:
    return 1 << (_DIGIT_BITS * rank)


def _as_counter(total: int) -> Counter:
    counts, rank = Counter(), 0
    while total:
        if digit := total & ((1 << _DIGIT_BITS) - 1):
            counts[rank] = digit
        total >>= _DIGIT_BITS
        rank += 1
    return counts


def simulate_reduce_scatter(schedules: list[Schedule]) -> list[Counter]:
    """Every rank's own chunk at the end: the multiset of ranks whose contribution it holds
    (each piece's, once the pieces are shown to agree and to tile the chunk)."""
    n = len(schedules)
    partials = [{} for _ in range(n)]  # (chunk, piece) -> contributions, to forward
    results = [{} for _ in range(n)]  # (chunk, piece) -> (offset, numel, contributions)

    def payload(rank, send):
        if send.prepare is Prepare.ENCODE:
            return _contribution(rank)
        key = (send.chunk, send.piece)
        assert key in partials[rank], f"rank {rank} forwards {key} it has no partial sum of"
        return partials[rank][key]

    def deliver(rank, receive, contributions):
        key = (receive.chunk, receive.piece)
        own = _contribution(rank)
        if receive.then is Then.ADD_REENCODE:
            partials[rank][key] = contributions + own
        elif receive.then is Then.ADD_KEEP:
            assert key not in results[rank], f"rank {rank} keeps {key} twice"
            results[rank][key] = (receive.offset, receive.numel, contributions + own)
        elif receive.then is Then.SUM:
            assert receive.chunk == rank, f"rank {rank} sums into chunk {receive.chunk}"
            offset, numel, total = results[rank].get(key, (receive.offset, receive.numel, own))
            assert (offset, numel) == (receive.offset, receive.numel), f"rank {rank}: {key}"
            results[rank][key] = (offset, numel, total + contributions)
        else:
            raise AssertionError(f"rank {rank}: {receive.then} in a reduction")

    run_lock_step(schedules, payload, deliver)
    everyone = sum(_contribution(rank) for rank in range(n))
    reduced = []
    for rank, schedule in enumerate(schedules):
        if not schedule.steps:  # a world of one: the own chunk is the own contribution
            results[rank][(rank, 0)] = (0, schedule.chunk_numel, _contribution(rank))
        assert {chunk for chunk, _ in results[rank]} == {rank}, (
            f"rank {rank} ends with chunks {sorted({chunk for chunk, _ in results[rank]})}"
        )
        for key, (_, _, total) in results[rank].items():
            if total != everyone:
                counts, all_ranks = _as_counter(total), Counter(range(n))
                raise AssertionError(
                    f"rank {rank} {key}: missing {sorted(all_ranks - counts)}, "
                    f"duplicated {dict(counts - all_ranks)}"
                )
        slices = [(offset, numel) for offset, numel, _ in results[rank].values()]
        assert_tiles(slices, schedule.chunk_numel, f"rank {rank} own chunk")
        reduced.append(_as_counter(next(iter(results[rank].values()))[2]))
    return reduced


# ---------------------------------------------------------------- every rank's data arrives


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("world_size", WORLDS)
@pytest.mark.parametrize("algorithm", GATHERS)
def test_all_gather_leaves_every_chunk_once_on_every_rank(algorithm, world_size, codec):
    """fp32 input here; the all-reduce test below runs these on bf16 partial sums too."""
    schedules = nth("all_gather", algorithm, world_size, SHARD, torch.float32, codec, 0)
    values = simulate_all_gather(schedules)
    assert all(value == {c: c for c in range(world_size)} for value in values)


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_each_algorithm_does_what_its_name_says_on_receipt(world_size):
    """The simulator accepts any receive action that keeps the data flowing; this pins them:
    ring forwards as received, ring-hop re-encodes at every hop but the last, a ring
    reduce-scatter adds at every hop and keeps at the last, alltoall/backend sum."""
    n, rounds = world_size, world_size - 1

    def thens(op, algorithm):
        (schedule,) = plan(op, algorithm, 0, n, n * SHARD, torch.float32, "int8", CHUNK_BYTES)
        return [(step.round, r.then) for step in schedule.steps for r in step.receives]

    assert {t for _, t in thens("all_gather", "ring")} == {Then.DECODE}
    assert {t for _, t in thens("all_gather", "backend")} == {Then.DECODE}
    hop = thens("all_gather", "ring-hop")
    assert all(t is (Then.DECODE if r == rounds - 1 else Then.DECODE_REENCODE) for r, t in hop)
    for algorithm in ("ring", "ring-hop"):
        summed = thens("reduce_scatter", algorithm)
        assert all(
            t is (Then.ADD_KEEP if r == rounds - 1 else Then.ADD_REENCODE) for r, t in summed
        )
    for algorithm in ("alltoall", "backend"):
        assert {t for _, t in thens("reduce_scatter", algorithm)} == {Then.SUM}


@pytest.mark.parametrize("world_size", WORLDS)
def test_a_pipelined_ring_all_gather_also_leaves_every_piece_once(world_size):
    """The ring all-gather can be cut into pieces (not registered so: see ring.all_gather)."""
    from commpress.schedules import ring

    codec = get_codec("int8")
    schedules = [
        ring.all_gather(r, world_size, SHARD, torch.float32, codec, hop=False, chunk_bytes=512)
        for r in range(world_size)
    ]
    assert all(len(s.steps) == (world_size - 1) * 3 for s in schedules)
    values = simulate_all_gather(schedules)
    assert all(value == {c: c for c in range(world_size)} for value in values)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("world_size", WORLDS)
@pytest.mark.parametrize("algorithm", REDUCTIONS)
def test_reduce_scatter_sums_each_contribution_once_into_its_chunk(algorithm, world_size, codec):
    """fp32 input here; the all-reduce test below runs these on bf16 input too."""
    numel = reduction_numel(world_size)
    schedules = nth("reduce_scatter", algorithm, world_size, numel, torch.float32, codec, 0)
    reduced = simulate_reduce_scatter(schedules)
    assert reduced == [Counter(range(world_size))] * world_size


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("world_size", WORLDS)
@pytest.mark.parametrize("algorithm", REDUCTIONS)
def test_all_reduce_gathers_the_reduced_chunks(algorithm, world_size, codec):
    everyone = Counter(range(world_size))
    for dtype in DTYPES:
        numel = reduction_numel(world_size)
        reduce, gather = (
            nth("all_reduce", algorithm, world_size, numel, dtype, codec, index) for index in (0, 1)
        )
        assert {s.op for s in reduce} == {"reduce_scatter"}
        assert {s.op for s in gather} == {"all_gather"}
        assert {s.algorithm for s in gather} == {ALL_REDUCE_GATHER[algorithm]}
        assert gather[0].chunk_numel == reduce[0].chunk_numel == -(-numel // world_size)
        # the reduced chunks travel as the ring's partial sums do
        partial_sum = "float32" if codec == "int8" or dtype == torch.float32 else "bfloat16"
        assert gather[0].payload_dtype == partial_sum
        values = simulate_all_gather(gather, simulate_reduce_scatter(reduce))
        assert all(value[chunk] == everyone for value in values for chunk in range(world_size))


# ---------------------------------------------------------------- the byte counts


def pieces(numel: int) -> list[int]:
    return [min(PIECE, numel - start) for start in range(0, numel, PIECE)] or [0]


def expected_all_gather(algorithm, world_size, numel, dtype, codec) -> tuple[int, int]:
    """(steps, bytes sent by each rank)."""
    n = world_size
    wire = get_codec(codec).wire_bytes
    if algorithm == "backend":
        return min(n - 1, 1), (n - 1) * wire(numel, dtype)
    if algorithm == "multicast":  # one broadcast per rank; the network copies the own one
        return (n, wire(numel, dtype)) if n > 1 else (0, 0)
    return n - 1, (n - 1) * wire(numel, dtype)  # whole shards, one per round


def expected_reduce_scatter(algorithm, world_size, numel, dtype, codec) -> tuple[int, int]:
    n = world_size
    chunk = -(-numel // n)
    wire = get_codec(codec).wire_bytes
    if algorithm == "backend":
        return min(n - 1, 1), (n - 1) * wire(chunk, dtype)
    if algorithm == "alltoall":  # one exchange per piece
        sizes = pieces(chunk)
        return len(sizes) if n > 1 else 0, (n - 1) * sum(wire(size, dtype) for size in sizes)
    partial_sum = torch.float32 if codec == "int8" else dtype
    sizes = pieces(chunk) if algorithm == "ring" else [chunk]
    return (n - 1) * len(sizes), (n - 1) * sum(wire(size, partial_sum) for size in sizes)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world_size", WORLDS)
def test_counts_are_the_textbook_ones(world_size, dtype, codec):
    n = world_size
    itemsize = dtype.itemsize
    count = functools.partial(wire_bytes, codec=codec, world_size=n, dtype=dtype)

    for algorithm in GATHERS:
        schedules = nth("all_gather", algorithm, n, SHARD, dtype, codec, 0)
        steps, sent = expected_all_gather(algorithm, n, SHARD, dtype, codec)
        for schedule in schedules:
            assert (len(schedule.steps), schedule.sent_bytes) == (steps, sent), schedule.rank
            if algorithm not in ("backend", "multicast"):
                assert schedule.rounds == n - 1
        assert count("all_gather", algorithm, numel=SHARD, chunk_bytes=CHUNK_BYTES) == sent
    assert count("all_gather", NATIVE, numel=SHARD) == (n - 1) * SHARD * itemsize

    numel = reduction_numel(n)
    chunk = -(-numel // n)
    for algorithm in REDUCTIONS:
        schedules = nth("reduce_scatter", algorithm, n, numel, dtype, codec, 0)
        steps, sent = expected_reduce_scatter(algorithm, n, numel, dtype, codec)
        for schedule in schedules:
            assert (len(schedule.steps), schedule.sent_bytes) == (steps, sent), schedule.rank
            payloads = sum(len(send.dsts) for step in schedule.steps for send in step.sends)
            if algorithm == "backend":
                assert payloads == n - 1
            elif algorithm == "alltoall":
                assert payloads == (n - 1) * len(pieces(chunk))
            else:
                assert schedule.rounds == n - 1
        assert count("reduce_scatter", algorithm, numel=numel, chunk_bytes=CHUNK_BYTES) == sent

        gather = ALL_REDUCE_GATHER[algorithm]
        partial_sum = torch.float32 if codec == "int8" or dtype == torch.float32 else dtype
        _, gathered = expected_all_gather(gather, n, chunk, partial_sum, codec)
        total = count("all_reduce", algorithm, numel=numel, chunk_bytes=CHUNK_BYTES)
        assert total == sent + gathered
    assert count("reduce_scatter", NATIVE, numel=numel) == (n - 1) * chunk * itemsize
    assert count("all_reduce", NATIVE, numel=numel) == 2 * (n - 1) * chunk * itemsize


def test_the_ring_reduce_scatter_cuts_chunks_into_pieces():
    """Each piece is one step of its round, the last piece shorter; the sizes of the tests
    above give three pieces per chunk at every world size."""
    assert {len(pieces(-(-reduction_numel(n) // n))) for n in WORLDS} == {3}
    (schedule,) = plan("reduce_scatter", "ring", 0, 4, 4 * 300, torch.float32, "int8", 512)
    assert [(s.sends[0].offset, s.sends[0].numel) for s in schedule.steps[:4]] == [
        (0, 128),
        (128, 128),
        (256, 44),
        (0, 128),
    ]
    assert [step.round for step in schedule.steps] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("world_size", [n for n in WORLDS if n >= 2])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_every_ring_is_a_chain_whose_receives_may_be_posted_a_step_ahead(op, world_size):
    """The executor posts each receive of a chain a step ahead; a ring whose next receive
    lands in the slot its previous step sends from, or in one an earlier step received
    into, is no chain."""
    numel = SHARD * world_size if op == "all_gather" else reduction_numel(world_size)
    for algorithm in ("ring", "ring-hop"):
        for schedule in nth(op, algorithm, world_size, numel, torch.float32, "int8", 0):
            assert schedule.chains_right, schedule
    (schedule,) = plan(op, "ring", 0, world_size, numel, torch.float32, "int8", CHUNK_BYTES)
    if len(schedule.steps) < 2:
        return

    def second_receives(chunk, piece) -> Schedule:
        first, second = schedule.steps[:2]
        moved = dataclasses.replace(second.receives[0], chunk=chunk, piece=piece)
        steps = (first, dataclasses.replace(second, receives=(moved,)), *schedule.steps[2:])
        return dataclasses.replace(schedule, steps=steps)

    first = schedule.steps[0]
    sent, received = first.sends[0], first.receives[0]
    assert not second_receives(sent.chunk, sent.piece).chains_right  # still being sent
    assert not second_receives(received.chunk, received.piece).chains_right  # received twice


# ---------------------------------------------------------------- the checks can fail


def _drop_the_last_round(schedule: Schedule) -> Schedule:
    """A ring all-gather of n - 2 rounds."""
    last = schedule.steps[-1].round
    return dataclasses.replace(
        schedule, steps=tuple(step for step in schedule.steps if step.round != last)
    )


def _shift_received_chunks(schedule: Schedule) -> Schedule:
    n = schedule.world_size
    steps = tuple(
        dataclasses.replace(
            step,
            receives=tuple(dataclasses.replace(r, chunk=(r.chunk + 1) % n) for r in step.receives),
        )
        for step in schedule.steps
    )
    return dataclasses.replace(schedule, steps=steps)


def _exchange_rank_1_to_0_twice(schedule: Schedule) -> Schedule:
    """alltoall with a second exchange that repeats rank 1's slice for rank 0: every
    message matches, but 0's chunk then holds rank 1's contribution twice."""
    step = schedule.steps[0]
    again = Step(
        1,
        tuple(send for send in step.sends if schedule.rank == 1 and send.dsts == (0,)),
        tuple(receive for receive in step.receives if schedule.rank == 0 and receive.src == 1),
    )
    return dataclasses.replace(schedule, steps=(*schedule.steps, again))


@pytest.mark.parametrize(
    "op, algorithm, break_it, complaint",
    [
        ("all_gather", "ring", _drop_the_last_round, "chunks missing"),
        ("all_gather", "ring", _shift_received_chunks, "sent but not received"),
        ("reduce_scatter", "alltoall", _exchange_rank_1_to_0_twice, r"duplicated \{1: 1\}"),
    ],
    ids=["ring-all-gather-drops-its-last-round", "receives-name-the-next-chunk", "duplicate"],
)
def test_the_simulator_catches_a_broken_schedule(op, algorithm, break_it, complaint):
    n = 5
    schedules = nth(op, algorithm, n, reduction_numel(n), torch.float32, "int8", 0)
    simulate = simulate_all_gather if op == "all_gather" else simulate_reduce_scatter
    simulate(schedules)  # the intact schedule passes
    with pytest.raises(AssertionError, match=complaint):
        simulate([break_it(schedule) for schedule in schedules])


# ---------------------------------------------------------------- printing


@pytest.mark.parametrize(
    "op, algorithm", [("reduce_scatter", "ring"), ("all_gather", "backend")], ids="-".join
)
def test_str_lists_every_send_and_receive_with_its_bytes(op, algorithm):
    (schedule,) = plan(op, algorithm, 1, 4, 4 * 300, torch.float32, "int8", 512)
    head, *lines = str(schedule).splitlines()
    assert f"{schedule.sent_bytes} bytes sent" in head and "rank 1 of 4" in head
    items = [item for step in schedule.steps for item in step.sends + step.receives]
    assert len(lines) == len(items) > 0
    sends = [line for line in lines if " send " in line]
    receives = [line for line in lines if " receive " in line]
    assert len(sends) == sum(len(step.sends) for step in schedule.steps)
    assert len(receives) == sum(len(step.receives) for step in schedule.steps)
    for item in items:  # every line names its bytes
        assert sum(f", {item.wire_bytes} B" in line for line in lines) >= 1
    assert all(line.endswith(" B") for line in lines)
    if algorithm == "backend":
        assert "-> 0,2,3:" in sends[0]


def test_wire_bytes_plans_one_rank_not_every_rank(monkeypatch):
    """From a bug hunt: ``commpress schedule --world 4096 --rank 0`` took six minutes, since
    the busiest rank's bytes were found by planning every rank (n plans of n steps). Every
    rank sends what rank 0 sends (test_counts_are_the_textbook_ones)."""
    import commpress.schedules.wire as wire

    planned = []

    def counting_plan(op, algorithm, rank, *args):
        planned.append(rank)
        return plan(op, algorithm, rank, *args)

    monkeypatch.setattr(wire, "plan", counting_plan)
    wire._wire_bytes.cache_clear()  # a cached answer plans nothing, old code or new
    sent = wire.wire_bytes("all_gather", "ring", "none", 3, 509, torch.float32, 4096)
    assert sent == 508 * 3 * 4
    assert planned == [0]


@pytest.mark.parametrize("numel", [0, 1, 999, 1000, 1001, 5000])
def test_piece_count_is_the_number_of_pieces_without_making_them(numel):
    from commpress.schedules.payloads import piece_count, pieces

    assert piece_count(numel, 1000) == len(pieces(numel, 1000))


# ---------------------------------------------------------------- mutation-testing gaps


def test_ring_hop_all_gather_sends_whole_shards_whatever_chunk_bytes():
    """``ring-hop`` decodes and re-encodes whole shards at every hop: ``chunk_bytes`` cuts
    only the ``ring`` all-gather into pieces (a 300-element shard in pieces of 128 would be
    3 steps a round)."""
    from commpress.schedules import ring

    codec = get_codec("int8")
    schedule = ring.all_gather(0, 4, SHARD, torch.float32, codec, hop=True, chunk_bytes=512)
    assert [(s.round, s.sends[0].offset, s.sends[0].numel) for s in schedule.steps] == [
        (0, 0, 300),
        (1, 0, 300),
        (2, 0, 300),
    ]


def test_a_lossless_reduction_of_fp16_sends_fp16_partial_sums():
    """``none`` on fp16 sends 2 bytes an element, as on bf16; a lossy codec encodes fp32
    partial sums."""
    from commpress.schedules.payloads import partial_sum_dtype

    assert partial_sum_dtype(get_codec("none"), torch.float16) == torch.float16
    assert partial_sum_dtype(get_codec("none"), torch.bfloat16) == torch.bfloat16
    assert partial_sum_dtype(get_codec("int8"), torch.float16) == torch.float32
    assert partial_sum_dtype(get_codec("none"), torch.float32) == torch.float32
    # 4 ranks, chunks of 300 fp16 elements: 3 hops of 600 bytes
    assert wire_bytes("reduce_scatter", "ring", "none", 1200, 4, torch.float16) == 3 * 600
    (schedule,) = plan("reduce_scatter", "ring", 0, 4, 1200, torch.float16, "none")
    assert schedule.payload_dtype == "float16"


def test_received_bytes_count_every_payload_that_arrives():
    """A multicast root injects its shard once and receives the n - 1 others; an all-to-all
    receives a slice from each of the n - 1 peers."""
    n = 4
    (cast,) = plan("all_gather", "multicast", 0, n, 100, torch.float32, "none")
    assert (cast.sent_bytes, cast.received_bytes) == (400, 3 * 400)
    (scatter,) = plan("reduce_scatter", "alltoall", 2, n, 4 * 100, torch.float32, "none")
    assert (scatter.sent_bytes, scatter.received_bytes) == (3 * 400, 3 * 400)


def test_the_in_band_check_adds_a_header_per_message_of_a_chain_else_one():
    """A chain run one step at a time carries a header in each of its n - 1 messages;
    a wider window, or a schedule that is no chain, sends one header alone; a world of
    one sends nothing."""
    from commpress.collectives import inband
    from commpress.schedules.wire import HEADER_BYTES, check_bytes

    assert HEADER_BYTES == inband._HEADER.size == 4 + 1 + 1 + 2 + 3 * 8
    n, shard = 4, 100
    (chain,) = plan("all_gather", "ring", 0, n, shard, torch.float32, "none")
    assert check_bytes(chain) == 3 * 32
    assert check_bytes(chain, window=2) == 32
    (backend,) = plan("all_gather", "backend", 0, n, shard, torch.float32, "none")
    assert check_bytes(backend) == 32
    count = functools.partial(wire_bytes, "all_gather", codec="none", dtype=torch.float32)
    assert count("ring", numel=shard, world_size=n, in_band_check=True) == 3 * 400 + 3 * 32
    assert count("ring", numel=shard, world_size=n, in_band_check=True, window=2) == 1200 + 32
    assert count("backend", numel=shard, world_size=n, in_band_check=True) == 1200 + 32
    assert count("backend", numel=shard, world_size=1, in_band_check=True) == 0
    assert count(NATIVE, numel=shard, world_size=n, in_band_check=True) == 1200


def test_the_busiest_link_carries_what_a_rank_sends_or_receives_whichever_is_more():
    """A ring's host link carries (n - 1) shards each way; a multicast root's uplink one
    shard, its downlink the n - 1 others."""
    from commpress.schedules.wire import busiest_link_bytes

    n, shard = 4, 100
    for algorithm in ("ring", "multicast", NATIVE):
        busiest = busiest_link_bytes("all_gather", algorithm, "none", shard, n, torch.float32)
        assert busiest == 3 * 400, algorithm


@pytest.mark.parametrize(
    "op, n, factor",
    [("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875), ("all_reduce", 4, 1.5)],
)
def test_busbw_factor_is_nccl_tests_one(op, n, factor):
    from commpress.schedules.wire import busbw_factor

    assert busbw_factor(op, n) == factor
    with pytest.raises(ValueError, match="unknown op 'broadcast'"):
        busbw_factor("broadcast", n)


def test_input_numel_counts_elements_of_the_dtype():
    """1000 bytes of bf16 are 500 elements: an all-gather's shard of 4 ranks is 125; a
    reduce-scatter keeps the 500 (a multiple of 4), an all-reduce every one."""
    from commpress.schedules.wire import input_numel, moved_bytes

    assert input_numel("all_gather", 1000, 4, torch.bfloat16) == 125
    assert input_numel("all_gather", 1000, 4, torch.float32) == 62
    assert input_numel("reduce_scatter", 1002, 4, torch.bfloat16) == 500
    assert input_numel("all_reduce", 1002, 4, torch.bfloat16) == 501
    assert moved_bytes("all_gather", 125, 4, torch.bfloat16) == 1000


def test_a_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 4\), got 4"):
        plan("all_gather", "ring", 4, 4, 100, torch.float32, "none")
    with pytest.raises(ValueError, match=r"rank must be in \[0, 4\), got -1"):
        plan("all_gather", "ring", -1, 4, 100, torch.float32, "none")


def test_an_algorithm_without_an_all_gather_to_finish_it_does_not_all_reduce():
    from commpress.schedules.registry import Algorithm

    reduces_only = Algorithm("x", "", None, lambda *args: None, None)
    assert reduces_only.supports("reduce_scatter")
    assert not reduces_only.supports("all_reduce")
    assert not reduces_only.supports("all_gather")
