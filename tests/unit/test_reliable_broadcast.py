"""The reliable-broadcast protocol on an in-memory network: every rank ends with every
root's payload bit for bit, whatever is lost, corrupted, truncated, stale or foreign.

The network here is a hub of queues (no sockets, no root), so the protocol's repair paths
run in milliseconds at any loss rate; the same engine over UDP multicast is tested on the
emulated cluster (``tests/cluster/test_multicast.py``).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import math
import os
import random
import struct
import threading
import time
import traceback
import types

import pytest

from commpress.transport import datagrams, multicast, native_receive, reliable_broadcast
from commpress.transport.datagrams import Header, Kind
from commpress.transport.reliable_broadcast import (
    OPERATION_IDS,
    STASH_AHEAD,
    BroadcastError,
    Engine,
    Operation,
    Options,
    newer,
)
from commpress.transport.udp import UdpNetwork, _segment_size

CHANNEL = 0xC0FE
FAST = dict(rate_bits=50 * 10**9, retry_s=0.005)


class Hub:
    """Datagrams between ranks of one process: ``mangle`` may drop or change each copy."""

    def __init__(self, world_size: int, mtu: int = 1500, mangle=None):
        self.world_size, self.mtu, self.mangle = world_size, mtu, mangle
        self.queues = [collections.deque() for _ in range(world_size)]
        self.ready = [threading.Condition() for _ in range(world_size)]
        self.sent_bytes = [0] * world_size

    def endpoint(self, rank: int) -> Endpoint:
        return Endpoint(self, rank)

    def deliver(self, src: int, dst: int, datagram: bytes) -> None:
        if self.mangle is not None:
            datagram = self.mangle(src, dst, datagram)
            if datagram is None:
                return
        with self.ready[dst]:
            self.queues[dst].append(datagram)
            self.ready[dst].notify()


class Endpoint:
    def __init__(self, hub: Hub, rank: int):
        self.hub, self.rank = hub, rank
        self.world_size, self.mtu = hub.world_size, hub.mtu
        self.closed = False

    def multicast(self, head, payload) -> None:
        datagram = bytes(head) + bytes(payload)
        self.hub.sent_bytes[self.rank] += len(datagram)
        for dst in range(self.world_size):
            if dst != self.rank:
                self.hub.deliver(self.rank, dst, datagram)

    def multicast_many(self, datagrams) -> None:
        sizes = [len(head) + len(payload) for head, payload in datagrams]
        assert len(sizes) <= self.batch_limit(sizes[0]), "a batch over the network's limit"
        assert all(size == sizes[0] for size in sizes[:-1]) and sizes[-1] <= sizes[0], sizes
        for head, payload in datagrams:
            self.multicast(head, payload)

    def batch_limit(self, datagram_bytes) -> int:
        return 4  # batches, as the kernel's segmentation makes them

    def unicast(self, rank, head, payload) -> None:
        datagram = bytes(head) + bytes(payload)
        self.hub.sent_bytes[self.rank] += len(datagram)
        self.hub.deliver(self.rank, rank, datagram)

    def receive(self, timeout, handle) -> None:
        ready, queue = self.hub.ready[self.rank], self.hub.queues[self.rank]
        with ready:
            if not queue:
                ready.wait(timeout)
            taken = list(queue)
            queue.clear()
        for batch, size in coalesced([d for d in taken if d is not None]):
            handle(memoryview(batch), size)

    def wake(self) -> None:
        with self.hub.ready[self.rank]:
            self.hub.queues[self.rank].append(None)
            self.hub.ready[self.rank].notify()

    def close(self) -> None:
        self.closed = True


def coalesced(datagrams: list[bytes], limit: int = 1 << 16) -> list[tuple[bytearray, int]]:
    """Datagrams in reads as the kernel's UDP_GRO makes them: consecutive ones of one size
    back to back (the last of a read may be shorter), in a writable buffer (as a socket's)."""
    reads: list[tuple[bytearray, int]] = []
    closed = True
    for datagram in datagrams:
        if reads and not closed:
            batch, size = reads[-1]
            if len(datagram) <= size and len(batch) + len(datagram) <= limit:
                batch += datagram
                closed = len(datagram) < size
                continue
        reads.append((bytearray(datagram), len(datagram)))
        closed = len(datagram) == 0
    return reads


@pytest.fixture(autouse=True, params=["native", "python"])
def receive_path(request, monkeypatch):
    """Every test twice: DATA datagrams taken in C (receive.c), and all in Python."""
    native = request.param == "native"
    if native and native_receive._library() is None:
        pytest.skip("the native receive path cannot be built here")
    monkeypatch.setattr(reliable_broadcast, "NATIVE_RECEIVE", native)
    return request.param


def engines(hub: Hub, **options) -> list[Engine]:
    merged = {**FAST, **options}
    return [Engine(hub.endpoint(r), CHANNEL, Options(**merged)) for r in range(hub.world_size)]


def order_of(world_size: int) -> list[int]:
    return list(range(world_size))


def all_gather(engines_, shards: list[bytes], operation_id: int = 0, order=None, timeout=20.0):
    """Every engine broadcasts its shard; returns what each rank received from each root."""
    world_size = len(engines_)
    order = order_of(world_size) if order is None else order
    operations, received = [], []
    for rank, engine in enumerate(engines_):
        buffers = {
            root: memoryview(bytearray(len(shards[root])))
            for root in range(world_size)
            if root != rank
        }
        operation = Operation(operation_id, order, memoryview(shards[rank]), buffers)
        operations.append(operation)
        received.append(buffers)
        engine.post(operation)
    for rank, operation in enumerate(operations):
        for root in order:
            assert operation.wait(root, timeout), f"rank {rank}: root {root} did not finish"
    return [{root: bytes(view) for root, view in buffers.items()} for buffers in received]


def random_shards(world_size: int, nbytes: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(nbytes) for _ in range(world_size)]


def check_exact(received, shards) -> None:
    for rank, buffers in enumerate(received):
        for root, data in buffers.items():
            assert data == shards[root], f"rank {rank} has a wrong copy of root {root}"


def close_all(engines_) -> None:
    """Close together: each one lingers a moment for late ENDs."""
    closing = [threading.Thread(target=engine.close) for engine in engines_]
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join()


@pytest.mark.parametrize("loss", [0.0, 0.01, 0.05, 0.2])
@pytest.mark.parametrize("world_size", [2, 5])
def test_every_rank_gets_every_payload_bit_for_bit(world_size, loss):
    hub = Hub(world_size)
    engines_ = engines(hub, loss=loss, seed=7)
    try:
        shards = random_shards(world_size, 200_000, seed=world_size)
        check_exact(all_gather(engines_, shards), shards)
        if loss:
            assert sum(e.stats.injected_losses for e in engines_) > 0
            assert sum(e.stats.repairs_sent for e in engines_) > 0
        else:
            assert sum(e.stats.repairs_sent for e in engines_) == 0
    finally:
        close_all(engines_)


@pytest.mark.parametrize("nbytes", [0, 1, 1446, 1447, 3 * 1446])
def test_sizes_at_chunk_edges(nbytes):
    hub = Hub(3)
    engines_ = engines(hub, loss=0.2, seed=1)
    try:
        shards = random_shards(3, nbytes, seed=nbytes)
        check_exact(all_gather(engines_, shards), shards)
    finally:
        close_all(engines_)


@pytest.mark.parametrize("concurrent_roots", [1, 2, 4])
def test_at_most_k_roots_send_at_once(concurrent_roots):
    """Log which root sent each first-time DATA datagram: a root may start only after the
    root K positions before it in the order has sent its last chunk."""
    world_size = 4
    senders = []

    def note(src, dst, datagram):
        header, _ = datagrams.parse(datagram)
        if header.kind is Kind.DATA and dst == (src + 1) % world_size:
            senders.append((header.root, header.chunk, header.count))
        return datagram

    hub = Hub(world_size, mangle=note)
    engines_ = engines(hub, concurrent_roots=concurrent_roots, rate_bits=10**8, burst_s=0.001)
    order = [0, 2, 1, 3]
    try:
        # large enough that a root's thread scheduled late on a loaded machine (CI failed
        # once with 60 KB: root 2 began after root 0's last datagram) still overlaps
        shards = random_shards(world_size, 400_000)
        check_exact(all_gather(engines_, shards, order=order), shards)
    finally:
        close_all(engines_)
    first = {root: senders.index(next(s for s in senders if s[0] == root)) for root in order}
    last = {
        root: max(i for i, s in enumerate(senders) if s[0] == root and s[1] == s[2] - 1)
        for root in order
    }
    for position, root in enumerate(order[concurrent_roots:], start=concurrent_roots):
        before = order[position - concurrent_roots]
        assert first[root] > last[before], (root, before, first, last)
    if concurrent_roots > 1:  # and K roots do send at once: their datagrams interleave
        assert any(first[root] < last[order[0]] for root in order[1:concurrent_roots])


def test_consecutive_operations_at_loss():
    hub = Hub(3)
    engines_ = engines(hub, loss=0.05, seed=3)
    try:
        for operation_id in range(4):
            shards = random_shards(3, 50_000, seed=operation_id)
            check_exact(all_gather(engines_, shards, operation_id), shards)
    finally:
        close_all(engines_)


def test_a_late_rank_gets_what_was_sent_before_it_posted(receive_path):
    """Datagrams of an operation this rank has not posted yet are kept and replayed: no
    loss here, so without them the late rank would need repairs (the END retry interval is
    longer than the test, so a lost chunk could not even be asked for in time). Replayed
    DATA go through the C path where it is on, as arriving ones do."""
    hub = Hub(3)
    engines_ = engines(hub, retry_s=30.0)
    try:
        shards = random_shards(3, 50_000, seed=1)
        check_exact(late_rank_gather(engines_, shards, 0), shards)
        assert engines_[2].stats.stashed > 0
        chunks = 2 * -(-50_000 // engines_[2].chunk_bytes)  # the late rank's new chunks
        expected = chunks if receive_path == "native" else 0
        assert engines_[2].stats.taken_natively == expected
        assert sum(e.stats.repairs_sent for e in engines_) == 0
        assert sum(e.stats.nacks_sent for e in engines_) == 0
    finally:
        close_all(engines_)


def test_a_late_rank_keeps_one_end_per_root_and_answers_it_once(receive_path):
    """A root repeats its END every retry until every receiver has ACKed; a rank that posts
    late kept every repetition (60 each in 0.3 s at 5 ms) and, replaying them, ACKed each:
    a burst of ACKs to every root, and stash bytes spent on copies of one datagram."""
    hub = Hub(3)
    engines_ = engines(hub, retry_s=0.005)
    try:
        shards = random_shards(3, 20_000, seed=1)
        check_exact(late_rank_gather(engines_, shards, 0), shards)
        late = engines_[2].stats
        data = 2 * -(-20_000 // engines_[2].chunk_bytes)
        assert late.stashed == data + 2, late  # one END of each root, not of the first alone
        assert late.acks_sent <= 3 * 2, late
    finally:
        close_all(engines_)


def late_rank_gather(engines_, shards, operation_id):
    results = {}
    done = threading.Event()

    def late():
        time.sleep(0.2)
        results["late"] = all_gather_one(engines_[2], 2, shards, operation_id)
        done.set()

    thread = threading.Thread(target=late)
    thread.start()
    early = [all_gather_one(engines_[r], r, shards, operation_id, wait=False) for r in (0, 1)]
    thread.join()
    for operation, _ in early:
        for root in operation.order:
            assert operation.wait(root, 20)
    return [early[0][1], early[1][1], results["late"][1]]


def all_gather_one(engine, rank, shards, operation_id, wait=True):
    world_size = len(shards)
    buffers = {
        root: memoryview(bytearray(len(shards[root]))) for root in range(world_size) if root != rank
    }
    operation = Operation(operation_id, order_of(world_size), memoryview(shards[rank]), buffers)
    engine.post(operation)
    if wait:
        for root in operation.order:
            assert operation.wait(root, 20)
    return operation, _Bytes(buffers)


class _Bytes(dict):
    def __init__(self, buffers):
        super().__init__()
        self._buffers = buffers

    def items(self):
        return ((root, bytes(view)) for root, view in self._buffers.items())


def corrupting(probability: float, seed: int = 0):
    rng = random.Random(seed)

    def mangle(src, dst, datagram):
        draw = rng.random()
        if draw < probability / 2:  # one bit flipped anywhere
            data = bytearray(datagram)
            bit = rng.randrange(len(data) * 8)
            data[bit // 8] ^= 1 << (bit % 8)
            return bytes(data)
        if draw < probability:  # cut short
            return datagram[: rng.randrange(len(datagram))]
        return datagram

    return mangle


def test_corrupted_and_truncated_datagrams_are_refused_and_repaired():
    hub = Hub(4, mangle=corrupting(0.1, seed=5))
    engines_ = engines(hub)
    try:
        shards = random_shards(4, 100_000, seed=9)
        check_exact(all_gather(engines_, shards), shards)
        refused = collections.Counter()
        for engine in engines_:
            refused.update(engine.stats.refused)
        assert refused["checksum"] > 0 and refused["truncated"] > 0, refused
    finally:
        close_all(engines_)


def test_foreign_and_stale_datagrams_are_ignored():
    """Datagrams of another channel, of a finished operation, and random bytes arrive in
    the middle of an operation: counted, never written into a buffer."""
    hub = Hub(3)
    engines_ = engines(hub)
    try:
        shards = random_shards(3, 30_000, seed=1)
        check_exact(all_gather(engines_, shards, operation_id=0), shards)
        poison = bytes(1446)
        for kind, channel, operation in ((Kind.DATA, CHANNEL + 1, 1), (Kind.DATA, CHANNEL, 0)):
            header = Header(kind, 1, 1, channel, operation, 0, 21)
            hub.deliver(1, 0, datagrams.pack(header, poison))
        hub.deliver(1, 0, b"not a datagram of this protocol at all")
        shards = random_shards(3, 30_000, seed=2)
        check_exact(all_gather(engines_, shards, operation_id=1), shards)
        stats = engines_[0].stats
        assert stats.refused["channel"] == 1 and stats.refused["foreign"] == 1
        assert stats.stale >= 1
    finally:
        close_all(engines_)


def test_a_silent_peer_times_out_and_abandon_stops_all_writes():
    """Rank 2 never runs. After rank 0 abandons, a valid DATA datagram of rank 2's payload
    (the right operation, count and length) must not be written, and rank 2's END must not
    be ACKed: rank 0 does not have its data."""
    sent = []

    def log(src, dst, datagram):
        sent.append((src, dst, datagrams.parse(datagram)[0]))
        return datagram

    hub = Hub(3, mangle=log)
    engines_ = engines(hub)[:2]
    try:
        shards = random_shards(3, 20_000)
        operation, buffers = all_gather_one(engines_[0], 0, shards, 0, wait=False)
        all_gather_one(engines_[1], 1, shards, 0, wait=False)
        assert operation.wait(1, 10)  # rank 1's payload arrives...
        assert not operation.wait(2, 0.3)  # ...rank 2's never does
        engines_[0].abandon(operation)
        count = -(-20_000 // 1446)
        late = Header(Kind.DATA, 2, 2, CHANNEL, 0, 0, count)
        hub.deliver(2, 0, datagrams.pack(late, b"\xff" * 1446))
        hub.deliver(2, 0, datagrams.pack(Header(Kind.END, 2, 2, CHANNEL, 0, 0, count)))
        time.sleep(0.1)
        assert not any(buffers._buffers[2]), "written after abandon"
        acks_to_2 = [h for src, dst, h in sent if src == 0 and dst == 2 and h.kind is Kind.ACK]
        assert acks_to_2 == [], "an abandoned operation was acknowledged"
    finally:
        close_all(engines_)


def test_a_stopped_or_closed_engine_fails_at_once():
    """After its thread has stopped, a post raises at once (no wait for the timeout); an
    operation running when the engine closes fails too."""
    hub = Hub(2)
    engine = Engine(hub.endpoint(0), CHANNEL, Options(**FAST))
    shards = random_shards(2, 10_000)
    running, _ = all_gather_one(engine, 0, shards, 0, wait=False)
    engine.close()
    with pytest.raises(BroadcastError, match="closed"):
        running.wait(0, 5)
    with pytest.raises(BroadcastError, match="closed"):
        all_gather_one(engine, 0, shards, 1, wait=False)


def test_a_failed_wait_frees_its_operation_without_a_gc_pass():
    """Each wait raised the operation's stored error: its traceback held the wait's frame,
    which held the operation, which held the error (a cycle that kept the caller's frames,
    group and tensors until a gc pass), and it grew by the frames of every wait."""
    import gc
    import weakref

    hub = Hub(2)
    engine = Engine(hub.endpoint(0), CHANNEL, Options(**FAST))
    operation, _ = all_gather_one(engine, 0, random_shards(2, 10_000), 0, wait=False)
    engine.close()
    freed = weakref.ref(operation)
    gc.disable()
    try:
        depths = []
        for root in operation.order:
            with pytest.raises(BroadcastError, match="closed") as raised:
                operation.wait(root, 5)
            depths.append(len(traceback.extract_tb(raised.value.__traceback__)))
            del raised
        assert depths[0] == depths[-1], f"the traceback grew with each wait: {depths}"
        del operation
        assert freed() is None, "the failed operation is held until a gc pass"
    finally:
        gc.enable()


def test_close_stops_the_lingering_thread_before_closing_the_network(monkeypatch):
    """With a retry interval that made the linger longer than close's wait (retry=0.6
    lingered 6 s, close waited 5), close returned with the thread alive and closed the
    network under it (a UDP network's selector gone: the thread failed, or read from a
    descriptor reused meanwhile). Close waits for the longest linger."""
    monkeypatch.setattr(reliable_broadcast, "CLOSE_S", 0.5)
    monkeypatch.setattr(reliable_broadcast, "MAX_LINGER_S", 0.5)
    used_after_close = []

    class Strict(Endpoint):
        def receive(self, timeout, handle):
            if self.closed:
                used_after_close.append(timeout)
            super().receive(timeout, handle)

    engine = Engine(Strict(Hub(2), 0), CHANNEL, Options(**{**FAST, "retry_s": 1.0}))
    engine._acked_at = time.monotonic()  # an ACK just sent: ten retries of 1 s to cover
    started = time.monotonic()
    engine.close()
    assert 0.4 < time.monotonic() - started < 5, "close did not linger within MAX_LINGER_S"
    assert not engine._thread.is_alive(), "close returned while the thread still ran"
    assert used_after_close == [], "the thread used the network after it was closed"


def test_a_close_long_after_the_last_ack_does_not_wait_for_retries():
    """Close lingered 10 retries (at most 5 s) whatever the ACKs: an engine with retry=1
    blocked its close 5 s, though no root could still be waiting for it."""
    engine = Engine(Hub(2).endpoint(0), CHANNEL, Options(**{**FAST, "retry_s": 1.0}))
    started = time.monotonic()
    engine.close()
    assert time.monotonic() - started < 2


def test_a_root_whose_acks_were_lost_is_answered_for_ten_retries_after_the_close(monkeypatch):
    """The linger was 10 retries but at most CLOSE_S (5 s): with retry=0.6 a root whose ACK
    was lost had 8 retries, not 10, once this rank closed; here scaled down (CLOSE_S 0.2,
    retry 0.1: 2 retries), the root loses the first 5 ACKs and needs the 6th retry."""
    monkeypatch.setattr(reliable_broadcast, "CLOSE_S", 0.2)
    lost = []

    def lose_first_acks(src, dst, datagram):
        header, _ = datagrams.parse(memoryview(datagram))
        if (src, dst, header.kind) == (1, 0, Kind.ACK) and len(lost) < 5:
            lost.append(header)
            return None
        return datagram

    engines_ = engines(Hub(2, mangle=lose_first_acks), retry_s=0.1)
    shards = random_shards(2, 10_000)
    root, _ = all_gather_one(engines_[0], 0, shards, 0, wait=False)
    all_gather_one(engines_[1], 1, shards, 0)
    closing = threading.Thread(target=engines_[1].close)
    closing.start()
    try:
        assert root.wait(0, 5), f"the root's END went unanswered after {len(lost)} lost ACKs"
        assert len(lost) == 5
    finally:
        closing.join()
        engines_[0].close()


@pytest.mark.parametrize("loss", [0.0, 0.2, 0.5])
def test_a_closing_engine_answers_enough_retries_that_injected_loss_rarely_drops_them_all(loss):
    """The linger was 10 retries at any injected loss: at 0.5 an END and its ACK both get
    through a quarter of the time, so a root missed all 10 answers of a rank that exited
    after its last all-gather 6% of the time, and timed out (on the emulated cluster, 1 job
    in 8 of 3 ranks, each ending on one multicast all-gather)."""
    engine = Engine(Hub(2).endpoint(0), CHANNEL, Options(**{**FAST, "loss": loss}))
    try:
        engine._acked_at = closed_at = 1000.0
        retries = (engine._linger_until_after(closed_at) - closed_at) / FAST["retry_s"]
        assert retries >= reliable_broadcast.LINGER_RETRIES
        assert (1 - (1 - loss) ** 2) ** retries < 1e-6, retries
    finally:
        engine.close()


def test_an_operation_posted_as_the_thread_stops_fails_at_once():
    """Another thread posts after the closing engine took its last requests, while its
    thread stops: the post was queued, never taken, and the operation waited for its
    whole timeout (the group's: 30 minutes by default) instead of failing."""
    late = []

    class Racing(Engine):
        def _fail_all(self, failure):
            if self._closing and time.monotonic() >= self._linger_until and not late:
                poster = threading.Thread(target=lambda: late.append(post_late(self)))
                poster.start()
                poster.join()
            super()._fail_all(failure)

    def post_late(engine):
        operation = Operation(1, [0, 1], memoryview(b"x"), {1: memoryview(bytearray(1))})
        try:
            engine.post(operation)
        except BroadcastError as refused:
            operation._fail(refused)  # refused at once: as good as failing
        return operation

    engine = Racing(Hub(2).endpoint(0), CHANNEL, Options(**FAST))
    engine.close()
    assert late, "the close did not reach the point of the race"
    with pytest.raises(BroadcastError, match="closed"):
        late[0].wait(0, 2)


def test_operation_ids_wrap_around():
    assert newer(0, 2**32 - 1) and newer(5, 2**32 - 3) and not newer(2**32 - 1, 0)
    hub = Hub(2)
    engines_ = engines(hub)
    try:
        for operation_id in (2**32 - 1, 0):
            shards = random_shards(2, 5_000, seed=operation_id % 7)
            check_exact(all_gather(engines_, shards, operation_id), shards)
        assert all(e.stats.stale == 0 for e in engines_)
    finally:
        close_all(engines_)


def test_a_failing_thread_fails_the_operation():
    class Broken(Endpoint):
        def multicast(self, head, payload):
            raise OSError("network is unreachable")

    hub = Hub(2)
    engine = Engine(Broken(hub, 0), CHANNEL, Options(**FAST))
    try:
        shards = random_shards(2, 10_000)
        operation, _ = all_gather_one(engine, 0, shards, 0, wait=False)
        with pytest.raises(BroadcastError, match="network is unreachable"):
            operation.wait(0, 10)
    finally:
        engine.close()


def test_a_failed_thread_lets_go_of_the_buffers_and_the_stash():
    """A channel whose thread failed stays in place (every later call fails at once): its
    engine must not keep the failed operation's payload buffers (the C taker pinned them)
    or the datagrams kept for later operations."""
    import gc
    import weakref

    import torch

    class AckFails(Endpoint):
        def unicast(self, rank, head, payload):
            raise OSError("network is unreachable")

    hub = Hub(2)
    engine = Engine(AckFails(hub, 0), CHANNEL, Options(**FAST))
    peer = Engine(hub.endpoint(1), CHANNEL, Options(**FAST))
    try:
        later = Header(Kind.DATA, 1, 1, CHANNEL, 1, 0, 1)
        hub.deliver(1, 0, datagrams.pack(later, b"x" * 100))
        deadline = time.monotonic() + 10
        while not engine.stats.stashed and time.monotonic() < deadline:
            time.sleep(0.01)
        received = torch.zeros(5000, dtype=torch.uint8)
        alive = weakref.ref(received)
        operation = Operation(0, [0, 1], memoryview(bytes(5000)), {1: received.numpy().data})
        engine.post(operation)
        all_gather_one(peer, 1, [bytes(5000)] * 2, 0, wait=False)
        with pytest.raises(BroadcastError, match="unreachable"):
            operation.wait(1, 10)
        engine._thread.join(10)
        del operation, received
        gc.collect()
        assert alive() is None, "the failed operation's buffer is still held"
        assert engine._stash == [] and engine._stash_bytes == 0
    finally:
        close_all([engine, peer])


def test_bytes_sent_per_rank_are_one_shard_and_headers():
    hub = Hub(4)
    engines_ = engines(hub)
    try:
        shards = random_shards(4, 1 << 20)
        check_exact(all_gather(engines_, shards), shards)
        for rank, engine in enumerate(engines_):
            assert hub.sent_bytes[rank] <= 1.03 * len(shards[rank])
            assert engine.stats.data_sent == -(-len(shards[rank]) // 1446)
    finally:
        close_all(engines_)


def test_a_root_slower_than_its_pace_reads_its_socket_between_buckets():
    """A root whose sends take longer than its pace allows (a busy CPU) must not send its
    whole payload before it reads again: meanwhile its peers' datagrams overflow its
    socket's receive buffer (2 emulated hosts, 64 MiB: a quarter of each shard sent again
    as repairs, benchmarks/multicast_send_2026-12-07). Between two reads it sends at most
    the bucket it had when it began."""
    most_unread = [0, 0]
    since_read = [0, 0]

    class Slow(Endpoint):
        def multicast_many(self, datagrams) -> None:
            time.sleep(0.002)  # a batch of 4 in 2 ms: 3 MB/s, a quarter of the pace
            super().multicast_many(datagrams)
            since_read[self.rank] += len(datagrams)
            most_unread[self.rank] = max(most_unread[self.rank], since_read[self.rank])

        def receive(self, timeout, handle) -> None:
            since_read[self.rank] = 0
            super().receive(timeout, handle)

    hub = Hub(2)
    options = Options(**{**FAST, "rate_bits": 10**8})
    engines_ = [Engine(Slow(hub, r), CHANNEL, options) for r in range(2)]
    try:
        shards = random_shards(2, 400_000)
        check_exact(all_gather(engines_, shards), shards)
        bucket = engines_[0]._burst // (engines_[0].chunk_bytes + datagrams.FRAME_OVERHEAD)
        assert 0 < bucket < len(shards[0]) // 1446 // 2
        assert 0 < max(most_unread) <= bucket, (most_unread, bucket)
    finally:
        close_all(engines_)


def test_a_paced_root_sends_whole_batches_once_its_first_bucket_is_spent():
    """A root woke as soon as its bucket held one datagram and sent it alone, so past its
    first bucket the segmentation's batches (one system call for up to 39 datagrams at
    MTU 1500) went out one datagram at a time; it now waits for a batch's worth."""
    sizes = []

    class Counting(Endpoint):
        def multicast_many(self, datagrams) -> None:
            sizes.append(len(datagrams))
            super().multicast_many(datagrams)

    hub = Hub(2)
    options = Options(**{**FAST, "rate_bits": 10**8, "burst_s": 0.002})
    engines_ = [Engine(Counting(hub, r), CHANNEL, options) for r in range(2)]
    try:
        shards = random_shards(2, 300_000)
        check_exact(all_gather(engines_, shards), shards)
    finally:
        close_all(engines_)
    assert sum(sizes) == 2 * -(-300_000 // 1446)
    assert len(sizes) <= sum(sizes) / 3, sizes  # batches of 4, but for a late few


def test_a_broadcast_starts_with_what_its_bucket_holds():
    """A root waits for a batch's worth of allowance between sends, but not before its first
    chunk: a broadcast that waited for a batch started up to a millisecond late (the
    selector's timeout granularity), 1.24x the time of 4 MiB of int8 on 2 emulated hosts."""
    (engine, _) = engines(Hub(2))
    try:
        engine._burst = 1 << 20
        cost = engine.chunk_bytes + datagrams.FRAME_OVERHEAD
        running = types.SimpleNamespace(repairs={}, next_chunk=0, own_count=100)
        assert engine._next_send_bytes(running) == cost
        running.next_chunk = 1
        assert engine._next_send_bytes(running) == 4 * cost  # the Hub's batches of 4
        running.next_chunk = 98
        assert engine._next_send_bytes(running) == 2 * cost  # the two chunks left
        running.repairs = {(1, 0): None}
        assert engine._next_send_bytes(running) == cost
    finally:
        close_all([engine, _])


def test_a_batch_larger_than_the_bucket_is_not_waited_for():
    """A root waits for a batch's worth of allowance, but never more than its bucket holds:
    with 39 datagrams a batch (MTU 1500) and a bucket of 4 at a slow pace, waiting for a
    whole batch would never send."""

    class Wide(Endpoint):
        def batch_limit(self, datagram_bytes) -> int:
            return 39

        def multicast_many(self, datagrams) -> None:
            for head, payload in datagrams:
                self.multicast(head, payload)

    hub = Hub(2)
    options = Options(**{**FAST, "rate_bits": 10**7, "burst_s": 0.001})
    engines_ = [Engine(Wide(hub, r), CHANNEL, options) for r in range(2)]
    try:
        assert engines_[0]._burst < 39 * (engines_[0].chunk_bytes + datagrams.FRAME_OVERHEAD)
        shards = random_shards(2, 30_000)
        check_exact(all_gather(engines_, shards, timeout=5.0), shards)
    finally:
        close_all(engines_)


def test_without_repairs_loss_is_caught():
    """The deliberately broken variant: an engine that ignores NACKs. The same checks as
    above must fail (here: the operation does not finish), or they prove nothing."""

    class NoRepairs(Engine):
        def _on_nack(self, running, header, payload):
            pass

    hub = Hub(3)
    options = Options(**{**FAST, "loss": 0.2, "seed": 4})
    broken = [NoRepairs(hub.endpoint(r), CHANNEL, options) for r in range(3)]
    try:
        shards = random_shards(3, 50_000)
        with pytest.raises(AssertionError, match="did not finish"):
            all_gather(broken, shards, timeout=0.5)
    finally:
        close_all(broken)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(loss=1.0), "loss"),
        (dict(loss=-0.1), "loss"),
        (dict(loss=False), "loss must be a probability"),
        (dict(concurrent_roots=0), "concurrent_roots"),
        (dict(rate_bits=True), "rate_bits"),
        (dict(retry_s=0), "retry_s"),
        (dict(retry_s=math.nan), "retry_s"),
        (dict(retry_s=1e-9), "retry_s must be at least 0.001"),  # timers firing back to back
        (dict(burst_s=-1), "burst_s"),
        (dict(burst_s=math.inf), "burst_s"),
        (dict(ttl=0), "ttl"),
        (dict(ttl=256), "ttl must be at most 255"),
        (dict(uplink_bits=0), "uplink_bits"),
        (dict(seed="7"), "seed must be an int"),
        (dict(seed=None), "seed must be an int"),
    ],
)
def test_bad_options_name_the_argument(options, message):
    with pytest.raises(ValueError, match=message):
        Options(**options)


def test_configure_on_a_rank_outside_the_group_sets_nothing():
    """Called on every rank as docs/multicast.md says, it raised "TypeError: cannot create weak
    reference to 'int' object" on those that new_group gave NON_GROUP_MEMBER."""
    import torch.distributed as dist

    outside, configured = dist.GroupMember.NON_GROUP_MEMBER, len(multicast._configured)
    multicast.configure(outside, rate_bits=10**8)
    assert len(multicast._configured) == configured
    with pytest.raises(ValueError, match="loss"):
        multicast.configure(outside, loss=2.0)


def test_pacing_shares_the_receive_link_and_the_uplink():
    gbit = 10**9
    assert Options(rate_bits=gbit).pace_bytes_per_s((0, 4), 8) == pytest.approx(gbit / 2 / 8 * 0.95)
    everyone = Options(rate_bits=gbit, concurrent_roots=8)
    assert everyone.pace_bytes_per_s(range(8), 8) == pytest.approx(gbit / 7 / 8 * 0.95)
    racks = Options(rate_bits=gbit, concurrent_roots=8, racks=2, uplink_bits=gbit // 2)
    assert racks.pace_bytes_per_s(range(8), 8) == pytest.approx(gbit / 8 / 8 * 0.95)
    # racks {0, 1}, {2, 3}, {4, 5}: the roots of racks 0 and 1 both enter rack 2's uplink
    three = Options(rate_bits=gbit, racks=3, uplink_bits=gbit // 2)
    assert three.pace_bytes_per_s((0, 2), 6) == pytest.approx(gbit / 4 / 8 * 0.95)


@pytest.mark.parametrize(
    "world_size, k, streams",
    [
        (4, 3, [3, 1]),
        (4, 2, [2, 2]),
        (4, 4, [3]),  # every rank a root: each receives from the 3 others
        (3, 2, [2, 1]),
        (5, 2, [2, 2, 1]),
        (6, 4, [4, 2]),
        (8, 3, [3, 3, 2]),
        (8, 8, [7]),
        (2, 5, [1]),
    ],
)
def test_each_round_is_paced_for_the_roots_it_has(world_size, k, streams):
    """The link rate shared by the roots of each round: a last round of fewer than K roots
    sends faster (it once ran at rate / K, below the link's rate)."""
    gbit = 10**9
    options = Options(rate_bits=gbit, concurrent_roots=k)
    rounds = options.rounds(list(range(world_size)))
    assert [len(roots) for roots in rounds] == [min(k, world_size - start) for start in
                                                range(0, world_size, k)]  # fmt: skip
    paces = [options.pace_bytes_per_s(roots, world_size) for roots in rounds]
    assert paces == pytest.approx([gbit / s / 8 * 0.95 for s in streams])


def _paces_sent(world_size, order, k, rate, sizes, **options):
    """An all-gather of shards of ``sizes`` bytes; per DATA datagram that reaches the next
    rank: ``(root, the root's pace, the roots not done in the root's own view, the roots
    that had not sent their last chunk yet)``. The view is read on the root's own thread,
    which is the one sending (the hub calls ``note`` inside the send)."""
    sent, unfinished = [], set(range(world_size))

    def note(src, dst, datagram):
        header, _ = datagrams.parse(datagram)
        if header.kind is Kind.DATA:
            if dst == (src + 1) % world_size:
                passed = engines_[src]._running.passed
                left = frozenset(root for root in order if root not in passed)
                sent.append((header.root, engines_[src]._pace, left, frozenset(unfinished)))
            if header.chunk == header.count - 1:  # sent: the first copy is delivered now
                unfinished.discard(header.root)
        return datagram

    hub = Hub(world_size, mangle=note)
    engines_ = engines(hub, concurrent_roots=k, rate_bits=rate, burst_s=0.001, **options)
    shards = [random.Random(root).randbytes(size) for root, size in enumerate(sizes)]
    try:
        check_exact(all_gather(engines_, shards, order=order), shards)
    finally:
        close_all(engines_)
    return sent


def _paced_for_the_roots_left(sent, options, world_size):
    """On one switch: once the roots not done in a root's view are K or fewer, it paces
    for exactly them, and no root outpaces what the roots that had not finished sending
    (at most K of them at once) leave it of a receiver's link."""
    assert options.racks == 1
    k = options.concurrent_roots
    for root, pace, left, unfinished in sent:
        if len(left) <= k:
            assert pace == pytest.approx(options.pace_bytes_per_s(sorted(left), world_size))
        sending_at_once = min(k, len(unfinished | {root}))
        allowed = options.pace_bytes_per_s(range(sending_at_once), world_size)
        assert pace <= allowed * (1 + 1e-9), (root, pace, sorted(unfinished))


def test_a_smaller_last_round_speeds_up_as_the_roots_before_finish():
    """K = 3 on 4 ranks: roots 0, 2, 1 at a third of the rate each, then root 3 alone. It
    starts once root 0 (K positions before it) is done, at their pace while two others may
    still be sending, at half the rate once only root 2 (with the most to send) is, and at
    the whole rate once all three are (it used to wait for all three at a third)."""
    world_size, order, rate = 4, [0, 2, 1, 3], 10**8
    third, half, whole = (rate / k / 8 * 0.95 for k in (3, 2, 1))
    sent = _paces_sent(world_size, order, 3, rate, [20_000, 60_000, 200_000, 800_000])
    _paced_for_the_roots_left(sent, Options(rate_bits=rate, concurrent_roots=3), 4)
    assert all(pace == pytest.approx(third) for root, pace, _, _ in sent if root == 0)
    last_of_the_first_round = max(i for i, (root, *_) in enumerate(sent) if root != 3)
    root_3 = [(i, pace) for i, (root, pace, *_) in enumerate(sent) if root == 3]
    assert root_3[0][0] < last_of_the_first_round, "root 3 waited for more than root 0"
    assert any(pace == pytest.approx(half) for _, pace in root_3), "never sped up beside root 2"
    assert root_3[-1][1] == pytest.approx(whole)


def test_with_every_rank_a_root_the_last_to_finish_speeds_up():
    """K = N = 4: every root at a third of the rate (each receiver takes three streams);
    the one with the most to send takes the whole rate once the other three are done, and
    half of it while one of them is still sending."""
    world_size, rate = 4, 10**8
    third, half, whole = (rate / k / 8 * 0.95 for k in (3, 2, 1))
    sent = _paces_sent(world_size, [0, 1, 2, 3], 4, rate, [20_000, 60_000, 200_000, 800_000])
    _paced_for_the_roots_left(sent, Options(rate_bits=rate, concurrent_roots=4), 4)
    assert all(pace == pytest.approx(third) for root, pace, _, _ in sent if root == 0)
    root_3 = [pace for root, pace, *_ in sent if root == 3]
    assert root_3[0] == pytest.approx(third)
    assert any(pace == pytest.approx(half) for pace in root_3)
    assert root_3[-1] == pytest.approx(whole)


def test_a_root_is_not_slowed_by_a_root_left_that_waits_for_its_token():
    """8 ranks in 2 racks (order 0, 4, 1, 5, 2, 6, 3, 7), K = 2, uplinks at half the host
    rate, root 6 late (its shard the largest): once 2 and 3 are done, 6 and 7 are left, both
    in rack 1, but 7 starts only after 6. Paced for both, 6 fell to half its uplink's rate,
    alone on it (a pace set exactly for the roots left, as a review found)."""
    rate, order = 10**8, [0, 4, 1, 5, 2, 6, 3, 7]
    options = dict(racks=2, uplink_bits=rate // 2)
    sizes = [20_000] * 6 + [600_000, 20_000]
    sent = _paces_sent(8, order, 2, rate, sizes, **options)
    paces = [pace for root, pace, _, _ in sent if root == 6]
    assert paces == sorted(paces), "root 6 slowed down"
    assert paces[-1] == pytest.approx(rate // 2 / 8 * 0.95)


def test_datagram_format_round_trip_and_refusals():
    header = Header(Kind.DATA, 3, 1, CHANNEL, 9, 4, 10)
    datagram = datagrams.pack(header, b"abc")
    assert datagrams.parse(datagram) == (header, memoryview(b"abc"))
    for bad, reason in (
        (datagram[:10], "truncated"),
        (datagram[:-1], "truncated"),
        (b"x" + datagram[1:], "foreign"),
        (datagram[:-1] + bytes([datagram[-1] ^ 1]), "checksum"),
    ):
        with pytest.raises(datagrams.Refused) as refused:
            datagrams.parse(bad)
        assert refused.value.reason == reason
    assert datagrams.unpack_ranges(datagrams.pack_ranges([(1, 4), (7, 9)], 100)) == [
        (1, 4),
        (7, 9),
    ]
    assert datagrams.chunk_bytes_for(1500) == 1446 and datagrams.chunk_bytes_for(9000) == 8946


class _RecordingSocket:
    """Stands in for a UDP socket: records what each ``sendmsg`` is given, and can refuse
    the segmented kind with an errno."""

    def __init__(self, refuse_segmented: int | None = None):
        self.calls: list[tuple[bytes, list]] = []
        self.refuse_segmented = refuse_segmented

    def sendmsg(self, parts, control, flags, address):
        if control and self.refuse_segmented is not None:
            raise OSError(self.refuse_segmented, os.strerror(self.refuse_segmented))
        self.calls.append((b"".join(bytes(part) for part in parts), list(control)))


def _network_over(sock) -> UdpNetwork:
    network = UdpNetwork.__new__(UdpNetwork)  # no interface needed: only the send path runs
    network._own, network.group = sock, ("239.255.0.1", 5000)
    network._segmentation, network.send_calls, network.send_drops = True, 0, 0
    return network


DATAGRAMS = [(bytes([k]) * 26, bytes([k]) * 100) for k in range(3)] + [(b"z" * 26, b"z" * 40)]


def test_a_batch_leaves_in_one_segmented_send():
    sock = _RecordingSocket()
    network = _network_over(sock)
    network.multicast_many(DATAGRAMS)
    ((sent, control),) = sock.calls
    assert sent == b"".join(head + payload for head, payload in DATAGRAMS)
    assert control == [(17, 103, struct.pack("H", 126))]  # SOL_UDP, UDP_SEGMENT, each size
    assert network.send_calls == 1
    # under 60000 bytes with each one's 42 bytes of IP, UDP and Ethernet headers
    assert network.batch_limit(8972) == 6 and network.batch_limit(1472) == 39


def test_datagrams_the_kernel_could_not_cut_apart_go_one_by_one():
    """Segmentation cuts at one size: a shorter datagram before the last would shift
    every one after it."""
    sock = _RecordingSocket()
    network = _network_over(sock)
    unequal = [DATAGRAMS[0], DATAGRAMS[3], DATAGRAMS[1]]
    network.multicast_many(unequal)
    assert [sent for sent, _ in sock.calls] == [head + payload for head, payload in unequal]
    assert all(control == [] for _, control in sock.calls) and network._segmentation


@pytest.mark.parametrize("refusal", [errno.EINVAL, errno.EIO])
def test_a_kernel_that_refuses_segmentation_gets_the_datagrams_one_by_one(refusal):
    sock = _RecordingSocket(refuse_segmented=refusal)
    network = _network_over(sock)
    network.multicast_many(DATAGRAMS)
    assert [sent for sent, _ in sock.calls] == [head + payload for head, payload in DATAGRAMS]
    assert network._segmentation is False and network.batch_limit(1500) == 1
    network.multicast_many(DATAGRAMS)  # no second try
    assert len(sock.calls) == 2 * len(DATAGRAMS)


def test_a_full_queue_loses_the_batch_and_a_real_error_is_raised():
    network = _network_over(_RecordingSocket(refuse_segmented=errno.ENOBUFS))
    network.multicast_many(DATAGRAMS)  # lost, as a dropped datagram is: repaired later
    assert network._segmentation is True and network.send_drops == len(DATAGRAMS)
    network = _network_over(_RecordingSocket(refuse_segmented=errno.ENETUNREACH))
    with pytest.raises(OSError, match="unreachable"):
        network.multicast_many(DATAGRAMS)


def test_capped_receive_buffers_under_warnings_as_errors_leave_no_socket_open(monkeypatch):
    """Not root and a low net.core.rmem_max: a warning, which ``-W error`` (or a test
    suite's filter) makes an exception. It was raised after the sockets had been set up,
    outside the cleanup: both sockets (one bound to the group's port) and the wake-up
    pipe stayed open. On the loopback interface (joined, nothing sent)."""
    import warnings

    from commpress.transport import udp

    closed = []
    original_close = UdpNetwork.close

    def recorded_close(self):
        original_close(self)
        closed.append(self)

    monkeypatch.setattr(udp, "interface_of", lambda address: ("lo", 65536))
    monkeypatch.setattr(UdpNetwork, "receive_buffer_bytes", property(lambda self: 0))
    monkeypatch.setattr(UdpNetwork, "close", recorded_close)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="receive buffers are 0 bytes"):
            UdpNetwork(0, 2, "127.0.0.1", ("239.255.77.1", 0))
    (network,) = closed
    assert network._sockets == [] and network._wake_read is None


def test_a_selector_that_cannot_be_made_leaves_no_socket_open(monkeypatch):
    """Out of file descriptors (EMFILE) when the selector was made, after the sockets and
    the wake-up pipe: the error reached the caller, and both sockets (one bound to the
    group's port) and the pipe stayed open."""
    from commpress.transport import udp

    opened = []
    original_socket = UdpNetwork._socket

    def recorded_socket(self):
        sock = original_socket(self)
        opened.append(sock)
        return sock

    def no_selector():
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(udp, "interface_of", lambda address: ("lo", 65536))
    monkeypatch.setattr(UdpNetwork, "receive_buffer_bytes", property(lambda self: 1 << 30))
    monkeypatch.setattr(UdpNetwork, "_socket", recorded_socket)
    monkeypatch.setattr(udp.selectors, "DefaultSelector", no_selector)
    with pytest.raises(OSError, match="Too many open files"):
        UdpNetwork(0, 2, "127.0.0.1", ("239.255.77.1", 0))
    assert len(opened) == 2 and all(sock.fileno() == -1 for sock in opened)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root passes net.core.rmem_max"
)
def test_root_gets_the_receive_buffers_it_asks_for_whatever_rmem_max(monkeypatch):
    """SO_RCVBUFFORCE was looked up in Python's socket module, which does not name it: root
    asked with SO_RCVBUF alone, capped by net.core.rmem_max (4 MiB of the 8 here, 208 KiB
    by default). Linux reports twice the grant."""
    import socket

    from commpress.transport import udp

    monkeypatch.setattr(udp, "interface_of", lambda address: ("lo", 65536))
    network = UdpNetwork(0, 2, "127.0.0.1", ("239.255.77.2", 0))
    try:
        for sock in network._sockets:
            granted = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2
            assert granted >= udp.RECEIVE_BUFFER_BYTES
    finally:
        network.close()


def _rmem_max() -> int | None:
    try:
        with open("/proc/sys/net/core/rmem_max") as limit:
            return int(limit.read())
    except OSError:
        return None


@pytest.mark.skipif(
    not (_rmem_max() or math.inf) < 64 << 20, reason="needs Linux's net.core.rmem_max, not huge"
)
def test_receive_buffers_capped_to_half_the_ask_are_warned_of(monkeypatch):
    """Linux reports twice the size it grants: the check compared that report with the
    size asked for, so a buffer capped at half of it (not root, net.core.rmem_max 4 MiB
    for the 8 asked) passed without a word."""
    import warnings

    from commpress.transport import udp

    ask = 2 * _rmem_max()
    monkeypatch.setattr(udp, "interface_of", lambda address: ("lo", 65536))
    monkeypatch.setattr(udp, "_SO_RCVBUFFORCE", None)  # as where not root
    monkeypatch.setattr(udp, "RECEIVE_BUFFER_BYTES", ask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match=f"receive buffers are {ask // 2} bytes"):
            UdpNetwork(0, 2, "127.0.0.1", ("239.255.77.3", 0))


def test_a_coalesced_read_is_cut_at_the_size_its_control_message_gives():
    assert _segment_size([(17, 104, struct.pack("i", 1472))]) == 1472
    assert _segment_size([]) is None
    assert _segment_size([(0, 104, struct.pack("i", 1472))]) is None  # another level


class _CoalescingSocket:
    """Hands out ``reads``: each ``(bytes, segment size or None)``, as ``recvmsg_into``."""

    def __init__(self, reads):
        self.reads = list(reads)

    def recvmsg_into(self, buffers, control_size, flags):
        if not self.reads:
            raise BlockingIOError
        data, segment = self.reads.pop(0)
        buffers[0][: len(data)] = data
        control = [] if segment is None else [(17, 104, struct.pack("i", segment))]
        return len(data), control, 0, None


def test_a_coalesced_read_reaches_the_protocol_with_its_datagrams_size():
    sock = _CoalescingSocket([(b"a" * 5 + b"b" * 5 + b"c" * 3, 5), (b"single", None)])
    network = UdpNetwork.__new__(UdpNetwork)
    network._buffer, network._wake_read, network.read_calls = bytearray(64), -1, 0
    key = types.SimpleNamespace(fileobj=sock)
    network._selector = types.SimpleNamespace(select=lambda timeout: [(key, 1)])
    received = []
    network.receive(0.0, lambda batch, size: received.append((bytes(batch), size)))
    assert received == [(b"aaaaabbbbbccc", 5), (b"single", 6)]
    assert network.read_calls == 2


def test_the_native_path_takes_the_clean_data_datagrams(receive_path, monkeypatch):
    """With the C path on, Python gets only what C stops at; every new chunk is taken by
    one or the other, once. A C path that took nothing fails the first assertion, one that
    copied wrongly the exact check (tried: without its checksum test,
    ``test_corrupted_and_truncated...`` fails; with the payload length read at the wrong
    offset, it takes nothing)."""
    in_python = collections.Counter()
    original = Engine._on_data

    def counted(self, running, header, payload):
        in_python["data"] += 1
        return original(self, running, header, payload)

    monkeypatch.setattr(Engine, "_on_data", counted)
    hub = Hub(3)
    engines_ = engines(hub)
    try:
        shards = random_shards(3, 100_000, seed=4)
        check_exact(all_gather(engines_, shards), shards)
    finally:
        close_all(engines_)
    data_received = 3 * 2 * -(-100_000 // engines_[0].chunk_bytes)
    natively = sum(engine.stats.taken_natively for engine in engines_)
    if receive_path == "native":  # the first rank to post runs natively from the start
        assert natively >= data_received / 3, (natively, data_received)
    else:
        assert natively == 0
    assert natively + in_python["data"] == data_received


def test_the_native_path_repairs_what_the_network_drops(receive_path):
    """Loss made by the network, not injected (which the C path leaves to Python): the
    chunks that do arrive are taken natively, the gaps repaired, the result exact."""
    rng = random.Random(3)
    hub = Hub(4, mangle=lambda src, dst, datagram: None if rng.random() < 0.05 else datagram)
    engines_ = engines(hub)
    try:
        shards = random_shards(4, 60_000, seed=6)
        check_exact(all_gather(engines_, shards), shards)
        assert sum(engine.stats.repairs_sent for engine in engines_) > 0
        natively = sum(engine.stats.taken_natively for engine in engines_)
        assert (natively > 0) == (receive_path == "native"), natively
    finally:
        close_all(engines_)


def _valid_data(sender, root, operation, chunk, count, payload):
    header = Header(Kind.DATA, sender, root, CHANNEL, operation, chunk, count)
    return datagrams.pack(header, payload)


def test_well_formed_datagrams_that_do_not_fit_the_operation_are_refused(receive_path):
    """Datagrams whose checksum is right but whose fields do not fit the running operation
    reach neither path's buffers; each is counted where Python counts it (C stops at them;
    tried: a C path without its count test writes the first one, and this test fails)."""
    hub = Hub(3)
    engine = Engine(hub.endpoint(0), CHANNEL, Options(**FAST))
    try:
        shards = random_shards(3, 3000)  # 3 chunks per root at MTU 1500
        operation, buffers = all_gather_one(engine, 0, shards, 5, wait=False)
        deadline = time.monotonic() + 10
        while not engine.stats.data_sent and time.monotonic() < deadline:
            time.sleep(0.01)  # running (its own broadcast started), so nothing is stashed
        chunk = engine.chunk_bytes
        full = b"\xab" * chunk
        junk = [
            _valid_data(1, 1, 5, 0, 4, full),  # another chunk count
            _valid_data(1, 1, 5, 3, 3, full),  # a chunk past the count
            _valid_data(1, 1, 5, 0, 3, full[:-1]),  # a payload of the wrong length
            _valid_data(1, 0, 5, 0, 3, full),  # this rank's own payload, from another rank
            _valid_data(1, 7, 5, 0, 3, full),  # a root outside the group
            _valid_data(0, 1, 5, 0, 3, full),  # this rank's own datagram, looped back
        ]
        for datagram in junk:
            hub.deliver(1, 0, datagram)
        while engine.stats.datagrams_received < len(junk) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.stats.datagrams_received == len(junk)
        assert engine.stats.refused == collections.Counter(count=2, length=1, sender=1, rank=1)
        assert engine.stats.taken_natively == 0
        assert all(data == bytes(len(data)) for _, data in buffers.items())
        engine.abandon(operation)
    finally:
        engine.close()


def test_a_channel_refuses_operation_ids_that_do_not_increase():
    """Ids come from the group's call numbers, 32 bits on the wire: they wrap around, but a
    number that does not come after the last one would pass a stale operation for new."""
    channel = object.__new__(multicast.Channel)
    channel._last_operation = None
    assert channel.operation_id(5) == 5
    assert channel.operation_id(OPERATION_IDS + 7) == 7
    with pytest.raises(ValueError, match="must increase"):
        channel.operation_id(6)


PEER_ADDRESSES = ("10.1.2.4", None, None, ())  # rank 1's part of a channel's first exchange
PEER_SOCKETS = (None, ("10.1.2.4", 1), 1500)  # and of its second: no failure, its port, MTU


def _set_up_as_rank_0_of_2(monkeypatch, network, peer_reports) -> list:
    """Channel setup on rank 0 of 2, in-process: ``network`` stands in for UdpNetwork, and
    each exchange answers with the next of ``peer_reports`` for rank 1 (or raises it).
    Returns what rank 0 sent, exchange by exchange."""
    import torch.distributed as dist

    peer_reports, sent = iter(peer_reports), []

    def all_gather_objects(value, group, timeout):
        sent.append(value)
        peer = next(peer_reports)
        if isinstance(peer, BaseException):
            raise peer
        return [value, peer]

    monkeypatch.setenv("COMMPRESS_MULTICAST_ADDRESS", "10.1.2.3")
    monkeypatch.setattr(multicast, "UdpNetwork", network)
    monkeypatch.setattr(multicast, "_indices_in_use", set())
    monkeypatch.setattr(dist, "get_rank", lambda group: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group: 2)
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: [0, 1])
    monkeypatch.setattr(multicast, "all_gather_objects", all_gather_objects)
    return sent


def test_a_channel_whose_peers_fail_during_setup_closes_its_sockets(monkeypatch):
    """Rank 0 has bound its sockets when the exchange of addresses fails (a peer died):
    the error reaches the caller and the sockets, bound to the group's port, are closed."""
    opened = []

    class Recorded:
        def __init__(self, rank, world_size, local, group, **kw):
            self.mtu, self.unicast_address, self.closed = 1500, (local, 1), False
            opened.append(self)

        def close(self):
            self.closed = True

    died = RuntimeError("Connection closed by peer")
    _set_up_as_rank_0_of_2(monkeypatch, Recorded, [PEER_ADDRESSES, died])
    with pytest.raises(RuntimeError, match="closed by peer"):
        multicast.Channel(object(), Options())
    assert [network.closed for network in opened] == [True]


def test_a_rank_whose_socket_setup_raises_otherwise_tells_its_peers(monkeypatch):
    """Setting up the sockets raised something other than MulticastSetupError or OSError
    (the capped-buffer warning, where warnings are errors): it left this rank before the
    second exchange, and its peers waited in that exchange for the group's timeout."""

    class Warns:
        def __init__(self, *args, **kw):
            raise RuntimeWarning("commpress multicast: receive buffers are 0 bytes")

    sent = _set_up_as_rank_0_of_2(monkeypatch, Warns, [PEER_ADDRESSES, PEER_SOCKETS])
    with pytest.raises(
        multicast.MulticastSetupError, match="rank 0: RuntimeWarning.* buffers are 0 bytes"
    ) as raised:
        multicast.Channel(object(), Options())
    assert len(sent) == 2 and "buffers are 0 bytes" in sent[1][0]
    assert isinstance(raised.value.__cause__, RuntimeWarning)  # its traceback is kept


class _Sockets:
    """A network whose setup succeeds."""

    def __init__(self, rank, world_size, local, group, **kw):
        self.mtu, self.unicast_address, self.closed = 1500, (local, 1), False

    def connect(self, peers):
        pass

    def close(self):
        self.closed = True


def test_an_engine_that_cannot_start_fails_every_rank_at_once(monkeypatch):
    """A rank whose engine could not start (after the second exchange) raised alone: its
    peers, set up, waited at the first operation until the timeout."""

    def no_engine(*args):
        raise OSError("no engine here")

    monkeypatch.setattr(multicast, "Engine", no_engine)
    sent = _set_up_as_rank_0_of_2(monkeypatch, _Sockets, [PEER_ADDRESSES, PEER_SOCKETS, None])
    with pytest.raises(multicast.MulticastSetupError, match="rank 0: no engine here"):
        multicast.Channel(object(), Options())
    assert len(sent) == 3 and "no engine here" in sent[2]


def test_a_peer_whose_engine_cannot_start_fails_this_rank_at_once(monkeypatch):
    engines = []

    class Recorded:
        def __init__(self, network, channel, options, global_ranks):
            self.network, self.closed = network, False
            engines.append(self)

        def close(self):
            self.closed = self.network.closed = True

    monkeypatch.setattr(multicast, "Engine", Recorded)
    peer_failed = "no engine here"
    _set_up_as_rank_0_of_2(monkeypatch, _Sockets, [PEER_ADDRESSES, PEER_SOCKETS, peer_failed])
    with pytest.raises(multicast.MulticastSetupError, match="rank 1: no engine here"):
        multicast.Channel(object(), Options())
    assert [engine.closed for engine in engines] == [True]


def test_a_failure_of_several_ranks_is_named_once_with_their_global_ranks():
    """Every rank's failure was repeated in full ("rank 0: cannot tell which interface
    ...; rank 1: cannot tell which interface ..."), and on a subgroup named by the rank in
    it alone."""
    problem = "cannot tell which interface to multicast on"
    with pytest.raises(multicast.MulticastSetupError) as raised:
        multicast._raise_failures([problem, None, problem, "no engine"], [1, 2, 3, 5])
    assert str(raised.value) == (
        f"multicast cannot be set up: ranks 0, 2 (global ranks 1, 3): {problem}; "
        "rank 3 (global rank 5): no engine"
    )
    multicast._raise_failures([None, None], [0, 1])  # nothing failed


@pytest.mark.parametrize(
    "group, message",
    [
        ("239.255.3.3:70000", r"PORT in \[1, 65535\]"),
        ("239.255.3.3:0", r"PORT in \[1, 65535\]"),
        ("239.255.3.3:x", "must be an IPv4 multicast ADDRESS:PORT"),
        ("10.0.0.1:45000", "must be an IPv4 multicast ADDRESS:PORT"),
        ("nonsense:45000", "must be an IPv4 multicast ADDRESS:PORT"),
        ("ff05::1234:45000", "must be an IPv4 multicast ADDRESS:PORT"),
        ("239.255.3.3:\u00b2", r"PORT in \[1, 65535\]"),
    ],
)
def test_a_bad_fixed_multicast_group_is_named(monkeypatch, group, message):
    """Port 70000 raised a bare OverflowError from bind on every rank; port 0 failed some
    ranks' sends and left the others waiting for broadcasts that never came. An IPv6
    multicast group passed, and every rank failed to bind it ("Address family for hostname
    not supported"); a port of digits that are not ASCII ("²") raised int()'s own
    ValueError, naming neither the variable nor what it takes."""
    from commpress.transport.multicast import _draw_group

    monkeypatch.setenv("COMMPRESS_MULTICAST_GROUP", group)
    with pytest.raises(ValueError, match=f"COMMPRESS_MULTICAST_GROUP.*{message}"):
        _draw_group()


def test_a_fixed_multicast_group_gives_each_channel_of_a_process_its_own_port(monkeypatch):
    """The channel at index n takes PORT + n; one that would pass 65535 is refused."""
    from commpress.transport.multicast import _draw_group, _placed

    monkeypatch.setenv("COMMPRESS_MULTICAST_GROUP", "239.255.3.3:47000")
    assert [_placed(_draw_group(), n)[0] for n in range(2)] == [
        ("239.255.3.3", 47000),
        ("239.255.3.3", 47001),
    ]
    monkeypatch.setenv("COMMPRESS_MULTICAST_GROUP", "239.255.3.3:65535")
    with pytest.raises(ValueError, match="would use port 65536"):
        _placed(_draw_group(), 1)


@pytest.mark.parametrize("fixed", [None, "239.255.3.3:47000"])
def test_channel_numbers_are_drawn_whatever_the_processes_seeds(monkeypatch, fixed):
    """Two jobs on one fixed group and port (or disjoint subgroups) are told apart by their
    channel numbers alone: jobs seed ``random`` and torch alike, so the draw must not follow
    those seeds. With a seeded draw these twenty would all be the same number."""
    import torch

    from commpress.transport.multicast import CHANNELS, _draw_group

    if fixed is None:
        monkeypatch.delenv("COMMPRESS_MULTICAST_GROUP", raising=False)
    else:
        monkeypatch.setenv("COMMPRESS_MULTICAST_GROUP", fixed)
    channels, python_state, torch_state = [], random.getstate(), torch.get_rng_state()
    try:
        for _ in range(20):
            random.seed(0)
            torch.manual_seed(0)
            channels.append(_draw_group()[1])
    finally:
        random.setstate(python_state)
        torch.set_rng_state(torch_state)
    assert all(1 <= channel <= CHANNELS for channel in channels)
    assert len(set(channels)) > 1


def test_a_wake_racing_a_close_writes_to_its_own_pipe_or_not_at_all(monkeypatch):
    """wake() read the pipe's number, close() closed it meanwhile, and wake() wrote to a
    closed descriptor (EBADF) or to whatever file had reused its number."""
    import os
    import threading
    import time

    from commpress.transport import udp

    network = UdpNetwork.__new__(UdpNetwork)
    network._sockets = []
    network._wake_read, network._wake_write = os.pipe()
    real_write, closer = os.write, threading.Thread(target=network.close)

    def slow_write(descriptor, data):
        closer.start()  # close() runs while this write is under way
        time.sleep(0.2)
        return real_write(descriptor, data)

    monkeypatch.setattr(udp.os, "write", slow_write)
    network.wake()  # raised OSError (EBADF) when close() got there first
    closer.join(5)
    assert network._wake_write is None and not closer.is_alive()


def test_a_channel_takes_the_lowest_port_free_on_every_rank_and_frees_it_on_close(monkeypatch):
    """Ports PORT + n were handed out past every channel ever set up: closed ones were
    never taken again, so a process ran out of ports after 65535 - PORT set-ups. The
    channel takes the lowest n that no rank of its group has open, and frees it once
    closed."""

    class Engine:
        def __init__(self, network, channel, options, global_ranks):
            pass

        def close(self):
            pass

    monkeypatch.setattr(multicast, "Engine", Engine)
    monkeypatch.setenv("COMMPRESS_MULTICAST_GROUP", "239.255.3.3:47000")
    peer_using_1_and_3 = ("10.1.2.4", None, None, (1, 3))
    exchanges = [peer_using_1_and_3, PEER_SOCKETS, None] * 3
    sent = _set_up_as_rank_0_of_2(monkeypatch, _Sockets, exchanges)
    multicast._indices_in_use.add(0)
    first = multicast.Channel(object(), Options())
    second = multicast.Channel(object(), Options())
    assert [first.group_address[1], second.group_address[1]] == [47002, 47004]
    assert [s[3] for s in sent[::3]] == [(0,), (0, 2)]
    first.close()
    assert multicast.Channel(object(), Options()).group_address[1] == 47002


def test_data_and_end_from_a_rank_other_than_their_root_are_refused(receive_path):
    """A DATA or END datagram comes from its root only (repairs too): one whose sender is
    another rank lies about whose payload it carries. Checksum, channel, operation, count,
    chunk and length all fit rank 1's payload here; both paths wrote it into rank 1's
    buffer and took the END as rank 1's."""
    hub = Hub(3)
    engine = Engine(hub.endpoint(0), CHANNEL, Options(**{**FAST, "retry_s": 30.0}))
    try:
        shards = random_shards(3, 3000)  # 3 chunks per root at MTU 1500
        operation, buffers = all_gather_one(engine, 0, shards, 5, wait=False)
        deadline = time.monotonic() + 10
        while not engine.stats.data_sent and time.monotonic() < deadline:
            time.sleep(0.01)  # running, so nothing is stashed
        full = b"\xab" * engine.chunk_bytes
        hub.deliver(2, 0, _valid_data(2, 1, 5, 0, 3, full))
        hub.deliver(2, 0, datagrams.pack(Header(Kind.END, 2, 1, CHANNEL, 5, 0, 3)))
        while engine.stats.datagrams_received < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.stats.datagrams_received == 2
        assert engine.stats.refused == collections.Counter(sender=2)
        assert engine.stats.taken_natively == 0 and engine.stats.nacks_sent == 0
        assert all(data == bytes(len(data)) for _, data in buffers.items())
        engine.abandon(operation)
    finally:
        engine.close()


def test_the_stash_keeps_the_next_few_operations_and_drops_the_rest(receive_path):
    """When an operation starts, no peer can be far ahead of it (each operation needs this
    rank's payload of the one before, but where a peer left one this rank is still to start:
    a timeout, a mismatch found beside the broadcasts): what the stash holds of the next
    STASH_AHEAD operations stays, the rest is stale. A datagram of an operation far ahead
    (well-formed, checksum right) was kept, its bytes counted against the stash's bound,
    until the ids reached it: in 2**31 operations at most."""
    hub = Hub(2)
    engines_ = engines(hub)
    try:
        far = Header(Kind.DATA, 1, 1, CHANNEL, 1000, 0, 1)
        near = Header(Kind.DATA, 1, 1, CHANNEL, STASH_AHEAD, 0, 1)
        just_beyond = Header(Kind.DATA, 1, 1, CHANNEL, STASH_AHEAD + 1, 0, 1)
        for header in (far, near, just_beyond):
            hub.deliver(1, 0, datagrams.pack(header, b"x" * 100))
        deadline = time.monotonic() + 10
        while engines_[0].stats.stashed < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engines_[0].stats.stashed == 3
        for operation_id in (0, 1):
            shards = random_shards(2, 5_000, seed=operation_id)
            check_exact(all_gather(engines_, shards, operation_id), shards)
        assert [operation for operation, _ in engines_[0]._stash] == [STASH_AHEAD]
        assert engines_[0]._stash_bytes == len(engines_[0]._stash[0][1])
        assert engines_[0].stats.stale >= 2
    finally:
        close_all(engines_)


@contextlib.contextmanager
def _a_root_sending_slowly():
    """``(hub, engine, operation, deadline)``: rank 0 of 2 has begun multicasting 300 KB at
    1.2 MB/s (a quarter second), operation 5; its peer is the test, through ``hub``."""
    hub = Hub(2)
    slow = Options(**{**FAST, "rate_bits": 10**7})
    engine = Engine(hub.endpoint(0), CHANNEL, slow)
    try:
        operation, _ = all_gather_one(engine, 0, random_shards(2, 300_000), 5, wait=False)
        deadline = time.monotonic() + 10
        while not engine.stats.data_sent and time.monotonic() < deadline:
            time.sleep(0.001)
        yield hub, engine, operation, deadline
        engine.abandon(operation)
    finally:
        engine.close()


def test_an_ack_before_the_root_has_sent_every_chunk_is_refused(receive_path):
    """A receiver ACKs a root's payload once it has every chunk, which the root has sent
    by then: an ACK that comes earlier lies. Taken, it finished the root's broadcast (its
    wait returned True) and the engine stopped sending it half way, so the receivers that
    lacked the rest waited for their timeout."""
    with _a_root_sending_slowly() as (hub, engine, operation, deadline):
        hub.deliver(1, 0, datagrams.pack(Header(Kind.ACK, 1, 0, CHANNEL, 5)))
        while engine.stats.datagrams_received < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not operation.wait(0, 0.05), "an early ACK finished the root's broadcast"
        assert engine.stats.refused == collections.Counter(early=1)


def test_a_nack_before_the_root_has_sent_every_chunk_is_refused(receive_path):
    """A receiver reports its gaps once the root's END has come, after the last chunk: a
    NACK that comes earlier lies. Taken, it queued repairs of chunks not sent yet, which
    then left twice (multicast, and again to that receiver alone)."""
    with _a_root_sending_slowly() as (hub, engine, operation, deadline):
        count = math.ceil(300_000 / engine.chunk_bytes)
        everything = datagrams.pack_ranges([(0, count)], engine.chunk_bytes)
        hub.deliver(1, 0, datagrams.pack(Header(Kind.NACK, 1, 0, CHANNEL, 5), everything))
        while engine.stats.data_sent < count and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)
        assert engine.stats.data_sent == count
        assert engine.stats.repairs_sent == 0, "repairs of chunks not sent yet"
        assert engine.stats.refused == collections.Counter(early=1)


def test_gaps_beyond_what_one_nack_holds_are_reported_once_the_first_are_repaired(
    receive_path, monkeypatch
):
    """A NACK holds 180 ranges: a receiver with more gaps reported the first 180, and the
    rest only once ``retry_s`` had passed without a new chunk, though none of them was
    queued or in flight (one retry per 180 gaps: here 30 s). The END that follows the
    repairs now brings the report of the gaps past the last one's ranges."""
    seen = set()

    def lose_every_other_chunk_once(src, dst, datagram):
        header, _ = datagrams.parse(memoryview(datagram))
        first = header.chunk not in seen
        if (src, dst, header.kind) == (0, 1, Kind.DATA) and header.chunk % 2 == 0 and first:
            seen.add(header.chunk)
            return None
        return datagram

    monkeypatch.setattr(reliable_broadcast, "MAX_LINGER_S", 0.5)  # the close's, at 30 s
    hub = Hub(2, mangle=lose_every_other_chunk_once)
    engines_ = engines(hub, retry_s=30.0)
    try:
        shards = random_shards(2, 500 * 1446)  # 250 gaps at rank 1
        check_exact(all_gather(engines_, shards, timeout=10), shards)
        assert engines_[1].stats.nacks_sent == 2
        assert engines_[0].stats.repairs_sent == 250
    finally:
        close_all(engines_)


def test_a_receiver_that_lost_the_end_does_not_wait_for_another_receivers_repairs(
    receive_path,
):
    """The root held its END back while it sent repairs: a receiver that had lost the END
    and a chunk learnt of its gap only once another receiver's repairs had all left, and
    where it was the next root (K = 1, order 0, 2, 1) the token waited with it. Here rank 1
    lost 190 chunks of root 0; rank 2 lost one and the END, and started only after the
    last of rank 1's repairs. The END is repeated during repairs now."""
    events, seen, lock = [], set(), threading.Lock()
    ends_to_2 = []

    def mangle(src, dst, datagram):
        header, _ = datagrams.parse(memoryview(datagram))
        with lock:
            if src == 0 and header.kind is Kind.DATA:
                first = (dst, header.chunk) not in seen
                seen.add((dst, header.chunk))
                if first and (dst, header.chunk >= 10) == (1, True):
                    return None
                if first and (dst, header.chunk) == (2, 5):
                    return None
                if not first and dst == 1:
                    events.append("repair to 1")
            if (src, dst, header.kind) == (0, 2, Kind.END):
                ends_to_2.append(header)
                if len(ends_to_2) == 1:
                    return None
            if (src, dst, header.kind, header.chunk) == (2, 0, Kind.DATA, 0):
                events.append("rank 2 starts")
        return datagram

    hub = Hub(3, mangle=mangle)
    engines_ = engines(hub, rate_bits=10**7, retry_s=0.05, concurrent_roots=1)
    try:
        shards = random_shards(3, 200 * 1446)
        started = time.monotonic()
        check_exact(all_gather(engines_, shards, order=[0, 2, 1]), shards)
        elapsed = time.monotonic() - started
        assert events.count("repair to 1") == 190
        assert events.index("rank 2 starts") < 190, "rank 2 waited for rank 1's repairs"
        # one END a retry during the repairs, not one after each send (a review's storm)
        assert engines_[0].stats.ends_sent <= elapsed / 0.05 + 5, engines_[0].stats
    finally:
        close_all(engines_)


def test_a_nack_of_overlapping_ranges_queues_each_chunk_once_in_one_pass(receive_path):
    """A receiver's NACK lists its gaps, disjoint; one that lists the whole payload over
    and over (180 ranges fit a datagram) made the root's thread walk every chunk of every
    range: 180 times the chunk count, several seconds of a stalled thread for a payload of
    a GiB. Each chunk is looked at once now, whatever the ranges, and a range past the
    payload or inverted queues nothing."""
    looked_at = []

    class Counted(collections.OrderedDict):
        def __setitem__(self, key, value):
            looked_at.append(key)
            super().__setitem__(key, value)

    class Counting(Engine):
        def _start(self, operation):
            super()._start(operation)
            self._running.repairs = Counted()

    hub = Hub(2)
    engine = Counting(hub.endpoint(0), CHANNEL, Options(**{**FAST, "retry_s": 30.0}))
    try:
        shards = random_shards(2, 100_000)
        count = -(-100_000 // engine.chunk_bytes)
        operation, _ = all_gather_one(engine, 0, shards, 5, wait=False)
        deadline = time.monotonic() + 10
        while engine.stats.data_sent < count and time.monotonic() < deadline:
            time.sleep(0.01)
        ranges = [(0, count)] * 170 + [(5, 2), (count, 2**32 - 1), (2**32 - 1, 0), (3, 9)]
        payload = b"".join(struct.pack("<II", *r) for r in ranges)
        hub.deliver(1, 0, datagrams.pack(Header(Kind.NACK, 1, 0, CHANNEL, 5), payload))
        while engine.stats.repairs_sent < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.stats.repairs_sent == count
        assert sorted(looked_at) == [(1, chunk) for chunk in range(count)]
        engine.abandon(operation)
    finally:
        engine.close()
