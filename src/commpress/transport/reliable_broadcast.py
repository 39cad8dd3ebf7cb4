"""Reliable broadcasts over an unreliable multicast: the protocol, on a thread of its own.

One :class:`Operation` is an all-gather's worth of broadcasts: every rank is the root of
one payload, which it multicasts once, cut into datagram-sized chunks; every other rank
receives it into a buffer of the size the schedule says. How loss is repaired:

* each receiver keeps a bitmap of the chunks of each root; every DATA datagram carries the
  chunk count, so the bitmap's size is checked, and the root's END (the chunk count again,
  multicast after its last chunk) says that any chunk still missing is a gap;
* a receiver with gaps sends the root a NACK listing them (ranges: as many as a datagram
  holds; those it had no room for at the next END); the root sends those chunks again to
  that receiver alone (each (receiver, chunk) queued once), and the receiver asks again
  once ``retry_s`` has passed without a new chunk since its last report (a repeated END
  does not make it ask sooner: that only duplicated repairs still queued or in flight);
* a receiver with every chunk sends the root an ACK; the root repeats its END every
  ``retry_s`` until every receiver has ACKed (while it sends repairs too: a receiver that
  lost the END does not wait for another's repairs to report its gaps), so a lost END,
  NACK, ACK or repair costs a timeout, never a hang; an END of an operation this rank has
  finished is ACKed again, also after the engine is closed, until :func:`linger_retries`
  retries have passed since its last ACK (:meth:`Engine.close`), and never one of an
  operation the caller gave up on (this rank lacks its data);
* at most ``concurrent_roots`` roots send at once, in rounds of K (:meth:`Options.rounds`):
  the root in position ``p`` of the operation's order starts once the root in position
  ``p - K`` is done (its END seen, or all its chunks here), a token passed by the
  broadcasts themselves;
* each root paces its datagrams (a token bucket at :meth:`Options.pace_bytes_per_s` of its
  round's roots), so that a round's roots fill, and do not overflow, a receiver's link or
  a rack's uplink. Once the roots not yet done (as far as this rank has seen) are K or
  fewer, no other root will send: each still sending paces for those alone where that is
  faster, faster as they finish (a round smaller than K, the last where K does not divide
  the ranks; the tail of a round whose roots started at different times, as every rank's
  with K = N); never slower (:meth:`Engine._speed_up`).
  The token passes root by root, so the K roots sending at once may span two rounds, and
  with racks load one uplink beyond its round's count (not paced for: the link drops the
  excess).

Datagrams of an operation this rank has not posted yet (a faster peer's next all-gather)
are kept, up to a bound (a root's END once, not each repetition), and replayed when it
starts (then those of the next
:data:`STASH_AHEAD` operations are kept, the rest dropped as stale); datagrams of another
channel, stale, truncated or corrupted ones are counted in :class:`Stats` and dropped,
which the protocol sees as loss. ``loss`` drops received datagrams at random (seeded) to
test all of this. The thread only touches the buffers of the operation it is running: once
:meth:`Engine.abandon` has returned, it never writes to them again.

The running operation's DATA datagrams, the bulk of what arrives, are checked and copied in
C where it is built (:mod:`commpress.transport.native_receive`, :data:`NATIVE_RECEIVE`),
a whole read at a time, and so are those kept for it before it was posted, when they are
replayed; it stops at anything else, which the Python code below handles.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import math
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from commpress.ranks import by_rank, name_ranks, this_rank
from commpress.transport import native_receive
from commpress.transport.datagrams import (
    FRAME_OVERHEAD,
    HEADER_BYTES,
    RANGE_BYTES,
    Header,
    Kind,
    Refused,
    chunk_bytes_for,
    pack_header,
    pack_ranges,
    parse,
    unpack_ranges,
)
from commpress.units import check_seconds

#: The shortest ``retry_s`` taken: the protocol's timers would otherwise spin the thread.
MIN_RETRY_S = 1e-3
#: How long the thread sleeps when nothing is due (a post or a datagram wakes it sooner).
IDLE_S = 0.05
#: Take the running operation's DATA datagrams in C where it is built (read at each start).
NATIVE_RECEIVE = True
#: Stashed datagrams of operations this many ids ahead of the one starting, at most, are
#: kept when it starts (:meth:`Engine._start`).
STASH_AHEAD = 8
#: Datagrams of operations not posted yet kept per engine, at most (bytes).
STASH_BYTES = 64 << 20
#: Operations whose END is still ACKed once done (a root that missed an ACK repeats it).
REMEMBERED_OPERATIONS = 8
#: Pacing runs a little below the link rate: the shaper's token bucket is the real limit.
PACE_MARGIN = 0.95
#: The pacing bucket holds ``burst_s`` of the pace, but never more than this: a burst that
#: lands in a switch's (or a shaper's) queue, where a few MiB is typical.
MAX_BURST_BYTES = 1 << 20
#: Operation ids are 32-bit on the wire and wrap around: "newer" is serial arithmetic.
OPERATION_IDS = 2**32
#: How long :meth:`Engine.close` waits for the thread to stop, beyond its longest linger.
CLOSE_S = 5.0
#: A closing engine keeps answering the ENDs of operations it finished (a root whose ACK
#: from this rank was lost would otherwise wait for it in vain once this process has moved
#: on or exited: TCP's TIME-WAIT, for the same reason): at least this long after the close,
LINGER_S = 0.2
#: and until this many of a root's END retries have passed since this rank's last ACK
#: (more where ``loss`` drops ENDs and ACKs on purpose: :func:`linger_retries`),
LINGER_RETRIES = 10
#: At an injected ``loss``, the chance that every END retry of the linger, or its ACK, is
#: dropped stays below this.
LINGER_MISS = 1e-6
#: but never longer than this after the close: with ``retry_s`` above a tenth of it, fewer
#: retries are covered, so that a close's blocking stays bounded.
MAX_LINGER_S = 5.0


def linger_retries(loss: float) -> int:
    """The END retries a closing engine answers: :data:`LINGER_RETRIES`, or enough that
    at ``loss`` (each END and each ACK dropped at that rate) all of them fail with a chance
    below :data:`LINGER_MISS`. The linger stays within :data:`MAX_LINGER_S` whatever this
    says: at the default ``retry_s`` (250 retries) that holds up to a loss of about 0.77,
    and a higher one can leave a root that missed its last ACK to its timeout."""
    answered = (1 - loss) ** 2
    if answered >= 1:
        return LINGER_RETRIES
    return max(LINGER_RETRIES, math.ceil(math.log(LINGER_MISS) / math.log1p(-answered)))


def _shortly_after(a: int, b: int) -> bool:
    """Whether operation id ``a`` comes after ``b`` by at most :data:`STASH_AHEAD`."""
    return 0 < (a - b) % OPERATION_IDS <= STASH_AHEAD


def newer(a: int, b: int) -> bool:
    """Whether operation id ``a`` comes after ``b`` (RFC 1982 serial numbers, 32 bits)."""
    return 0 < (a - b) % OPERATION_IDS < OPERATION_IDS // 2


class Network(Protocol):
    """What the protocol needs from the wire; :mod:`commpress.transport.udp` is the real
    one. ``head`` and ``payload`` are sent back to back as one datagram."""

    rank: int
    world_size: int
    mtu: int

    def multicast(self, head: bytes, payload) -> None: ...
    def multicast_many(self, datagrams: Sequence[tuple[bytes, object]]) -> None:
        """Multicast each ``(head, payload)`` in order (every one but the last of the same
        size), at once where the network can."""

    def batch_limit(self, datagram_bytes: int) -> int:
        """The most datagrams of that size one :meth:`multicast_many` takes (1 or more)."""

    def unicast(self, rank: int, head: bytes, payload) -> None: ...
    def receive(self, timeout: float, handle: Callable[[memoryview, int], None]) -> None:
        """Wait up to ``timeout`` s for datagrams; ``handle(batch, size)`` each read: one
        datagram, or several back to back, each ``size`` bytes but the last (the view is
        valid only during the call). Returns early when :meth:`wake` is called."""

    def wake(self) -> None: ...
    def close(self) -> None: ...


MAX_TTL = 255


@dataclasses.dataclass(frozen=True)
class Options:
    """How broadcasts are paced and how much loss is injected; every rank must agree."""

    rate_bits: int = 10**9  # each host link's rate, bits per second
    concurrent_roots: int = 2  # K: roots that send at once
    racks: int = 1  # racks the ranks are split into, in order (hosts numbered rack by rack)
    uplink_bits: int | None = None  # a rack's uplink rate, when it is slower than needed
    loss: float = 0.0  # probability that a received datagram is dropped (injected)
    seed: int = 0
    retry_s: float = 0.02  # NACK again / END again after this long without progress
    ttl: int = 1  # multicast hops: 1 stays in the layer-2 network
    # How much sending time the pacing bucket keeps when the thread falls behind: with
    # 1 ms, a thread descheduled for longer (8 hosts on 2 cores) lost that time for good.
    burst_s: float = 0.01

    def __post_init__(self):
        for name in ("rate_bits", "concurrent_roots", "racks", "ttl"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.uplink_bits is not None and (
            isinstance(self.uplink_bits, bool)
            or not isinstance(self.uplink_bits, int)
            or self.uplink_bits < 1
        ):
            raise ValueError(f"uplink_bits must be a positive int, got {self.uplink_bits!r}")
        if self.ttl > MAX_TTL:
            raise ValueError(f"ttl must be at most {MAX_TTL} (an 8-bit field), got {self.ttl}")
        if (
            isinstance(self.loss, bool)
            or not isinstance(self.loss, (int, float))
            or not 0 <= self.loss < 1
        ):
            raise ValueError(f"loss must be a probability in [0, 1), got {self.loss!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        for name in ("retry_s", "burst_s"):
            check_seconds(getattr(self, name), name)
        if self.retry_s < MIN_RETRY_S:
            raise ValueError(
                f"retry_s must be at least {MIN_RETRY_S} s (a NACK or END again sooner than "
                f"a scheduler's time slice only repeats what is still in flight), "
                f"got {self.retry_s!r}"
            )

    def rounds(self, order: Sequence[int]) -> list[tuple[int, ...]]:
        """The roots of ``order`` that send at once, round by round: K at a time, so the
        last round is smaller where K does not divide the ranks."""
        k = self.concurrent_roots
        return [tuple(order[start : start + k]) for start in range(0, len(order), k)]

    def pace_bytes_per_s(self, roots: Sequence[int], world_size: int) -> float:
        """One root's sending rate while ``roots`` send at once (a round, or the roots
        left at the end of an operation, :meth:`Engine._speed_up`): they share
        each receiver's link (a receiver among them receives from the others only), and
        with racks each uplink, both ways."""
        streams = len(roots) - (len(roots) == world_size)
        rate = self.rate_bits / max(1, streams)
        if self.uplink_bits is not None and self.racks > 1:
            rate = min(rate, self.uplink_bits / self._uplink_streams(roots, world_size))
        return rate / 8 * PACE_MARGIN

    def _uplink_streams(self, roots: Sequence[int], world_size: int) -> int:
        """The most broadcasts of ``roots`` that one rack's uplink carries one way: out,
        those of its own roots; in, those of every other rack's (ranks split into racks
        in order)."""
        racks = min(self.racks, world_size)
        in_rack = collections.Counter(root * racks // world_size for root in roots)
        counts = [in_rack[rack] for rack in range(racks)]
        return max(1, max(counts), len(roots) - min(counts))


@dataclasses.dataclass
class Stats:
    """What one engine sent and received; ``wire_bytes`` counts frames as a link does."""

    datagrams_sent: int = 0
    wire_bytes_sent: int = 0
    data_sent: int = 0
    repairs_sent: int = 0
    nacks_sent: int = 0
    acks_sent: int = 0
    ends_sent: int = 0
    datagrams_received: int = 0
    taken_natively: int = 0  # of them, new chunks that the C path took (native_receive)
    duplicates: int = 0
    injected_losses: int = 0
    stale: int = 0
    late_acks: int = 0  # ACKs of a finished operation: a repeated END's second answer
    stashed: int = 0
    stash_dropped: int = 0
    refused: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class BroadcastError(RuntimeError):
    """An operation could not finish: a peer stopped answering, or sent what it must not."""


class Operation:
    """One all-gather's broadcasts, as the caller sees them: :meth:`wait` for each root."""

    def __init__(
        self,
        operation_id: int,
        order: Sequence[int],
        own: memoryview,
        incoming: dict[int, memoryview],
    ):
        self.id, self.order = operation_id, tuple(order)
        self.own, self.incoming = own, incoming
        self._done = {root: threading.Event() for root in self.order}
        self.error: BroadcastError | None = None

    def wait(self, root: int, timeout: float | None) -> bool:
        """Whether ``root``'s broadcast finished here within ``timeout`` s (this rank's own:
        every receiver has ACKed it); raises the engine's error if it failed."""
        finished = self._done[root].wait(timeout)
        if self.error is not None:
            raise BroadcastError(*self.error.args) from self.error.__cause__
        return finished

    def _finish(self, root: int) -> None:
        self._done[root].set()

    def _fail(self, error: BroadcastError) -> None:
        """Every wait raises a new copy of ``error``: raising the stored one would grow its
        traceback with each waiter's frames, one of which holds this operation, and so
        the error again (a cycle that kept the caller's group and tensors until a gc pass)."""
        self.error = error
        for event in self._done.values():
            event.set()


class _Incoming:
    """A root's payload arriving here."""

    def __init__(self, buffer: memoryview, chunk_bytes: int, missing: array.array, root: int):
        """``missing[root]`` counts the chunks still to come (an array that the native
        receive path updates too)."""
        self.buffer, self.chunk_bytes = buffer, chunk_bytes
        self.count = max(1, math.ceil(len(buffer) / chunk_bytes))
        self.bitmap = bytearray(self.count)
        self._missing, self._root = missing, root
        self.missing = self.count
        self.end_seen = False
        self.nacked_at = -math.inf
        self.reported_to = 0  # the chunks below this are those the last NACK's ranges cover
        self.progress_at = -math.inf  # when the last new chunk arrived

    @property
    def missing(self) -> int:
        return self._missing[self._root]

    @missing.setter
    def missing(self, value: int) -> None:
        self._missing[self._root] = value

    def length_of(self, chunk: int) -> int:
        return min(self.chunk_bytes, len(self.buffer) - chunk * self.chunk_bytes)

    def gaps(self, after: int = 0) -> list[tuple[int, int]]:
        """The missing chunks from chunk ``after`` on, as half-open ranges."""
        ranges, start = [], self.bitmap.find(0, after)
        while start >= 0:
            stop = self.bitmap.find(1, start)
            stop = self.count if stop < 0 else stop
            ranges.append((start, stop))
            start = self.bitmap.find(0, stop)
        return ranges


class _Running:
    """The engine's side of the operation it is running."""

    def __init__(self, operation: Operation, rank: int, world_size: int, chunk_bytes: int):
        self.operation = operation
        self.missing = array.array("q", bytes(8 * world_size))
        self.incoming = {
            root: _Incoming(buffer, chunk_bytes, self.missing, root)
            for root, buffer in operation.incoming.items()
        }
        self.own = operation.own
        self.own_count = max(1, math.ceil(len(self.own) / chunk_bytes))
        self.position = operation.order.index(rank)
        self.started = False
        self.next_chunk = 0
        self.repairs: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        self.end_due = math.inf  # when the root sends its END (again)
        self.acked: set[int] = set()
        self.receivers = world_size - 1
        self.passed: set[int] = set()  # roots done sending, as far as this rank knows
        self.paced_for_passed = 0  # len(passed) when the pace was last set (Engine._speed_up)

    def native_taker(self, channel: int, rank: int, chunk_bytes: int):
        """This operation's :func:`~commpress.transport.native_receive.taker`, or None."""
        roots = range(len(self.missing))
        empty = memoryview(bytearray())
        incoming = [self.incoming.get(root) for root in roots]
        return native_receive.taker(
            channel,
            self.operation.id,
            rank,
            chunk_bytes,
            [empty if i is None else i.buffer for i in incoming],
            [0 if i is None else i.count for i in incoming],
            [bytearray() if i is None else i.bitmap for i in incoming],
            self.missing,
        )

    @property
    def own_done(self) -> bool:
        return len(self.acked) == self.receivers

    @property
    def done(self) -> bool:
        return self.own_done and all(i.missing == 0 for i in self.incoming.values())


class Engine:
    """The protocol's state and its thread; one per channel (communicator)."""

    def __init__(
        self,
        network: Network,
        channel: int,
        options: Options,
        global_ranks: list[int] | None = None,
    ):
        """``global_ranks``: on a subgroup, its ranks' global ranks (errors name them too)."""
        self.network, self.channel, self.options = network, channel, options
        self.rank, self.world_size = network.rank, network.world_size
        self._this_rank = this_rank(self.rank, global_ranks)
        self.chunk_bytes = chunk_bytes_for(network.mtu)
        self._datagram_cost = self.chunk_bytes + FRAME_OVERHEAD  # what pacing charges for one
        self.stats = Stats()
        self._pace = self._burst = 0.0  # the running operation's round's (_start sets them)
        self._allowance, self._refilled = math.inf, time.monotonic()  # full: refills cap it
        self._batch_limit = network.batch_limit(self.chunk_bytes + HEADER_BYTES)
        if NATIVE_RECEIVE:
            native_receive.available()  # built now, not while the first operation runs
        self._losses = random.Random(options.seed * 1_000_003 + self.rank)
        self._posted: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: collections.deque[Operation] = collections.deque()
        self._running: _Running | None = None
        self._take: native_receive.Taker | None = None  # the running operation's, if native
        # finished here: an END of one is ACKed again (its root missed the ACK)
        self._finished: collections.deque[int] = collections.deque(maxlen=REMEMBERED_OPERATIONS)
        self._latest: int | None = None  # the id of the operation started last
        self._stash: list[tuple[int, bytearray]] = []  # (operation, datagram) of later operations
        self._stash_bytes = 0
        self._stashed_ends: set[tuple[int, int]] = set()  # (operation, root) of those ENDs
        self._closing = False
        self._linger_until = math.inf
        self._acked_at = -math.inf  # when this rank last sent an ACK
        self._failure: BaseException | None = None
        # held while a request is queued, and while the thread stops taking them
        self._accepting = threading.Lock()
        self._ended = False  # the thread takes no more requests
        self._thread = threading.Thread(target=self._loop, name="commpress-multicast", daemon=True)
        self._thread.start()

    # -- the caller's side ----------------------------------------------------------------

    def post(self, operation: Operation) -> None:
        """Run ``operation`` after those posted before it; returns at once."""
        self._request(("post", operation))

    def abandon(self, operation: Operation) -> None:
        """Stop running ``operation`` (the caller gave up on it); once this returns, the
        thread writes no more to its buffers."""
        self._request(("abandon", operation), wait=True)

    def describe(self, operation: Operation, global_ranks: list[int] | None = None) -> str:
        """What is still missing of ``operation`` (for an error message; approximate, read
        while the thread runs); ranks named as :mod:`commpress.ranks` names them, by their
        ``global_ranks`` too on a subgroup."""
        running = self._running
        if running is None or running.operation is not operation:
            return f"operation #{operation.id} is not running"
        missing = [None] * self.world_size
        for root, incoming in running.incoming.items():
            missing[root] = incoming.missing or None
        unacked = sorted(set(range(self.world_size)) - running.acked - {self.rank})
        named = name_ranks(unacked, global_ranks) if unacked else "none"
        return (
            f"operation #{operation.id}: chunks missing by root: "
            f"{by_rank(missing, global_ranks) or 'none'}. "
            f"Peers that have not acknowledged this rank's payload: {named}"
        )

    def close(self) -> None:
        """Stop the thread (operations still running or waiting fail) and the network.

        Blocks while the thread lingers (:meth:`_linger_until_after`): :data:`LINGER_S`
        where this rank sent its last ACK long enough ago, up to :func:`linger_retries`
        retries (at most :data:`MAX_LINGER_S`) where it has just sent one."""
        if self._thread.is_alive():
            self._request(("close", None), wait=True)
            self._thread.join(MAX_LINGER_S + CLOSE_S)
        self.network.close()

    def _linger_until_after(self, closed_at: float) -> float:
        """When the thread, closed at ``closed_at``, stops answering ENDs: once a root that
        missed this rank's last ACK has had :func:`linger_retries` retries to ask again (and
        :data:`LINGER_S` at least, for a root thread descheduled a while), within
        :data:`MAX_LINGER_S`."""
        retries = linger_retries(self.options.loss)
        retries_covered = self._acked_at + retries * self.options.retry_s
        return min(max(closed_at + LINGER_S, retries_covered), closed_at + MAX_LINGER_S)

    def _request(self, request, wait: bool = False) -> None:
        """Hand ``request`` to the thread; with ``wait``, until it has been taken. Raises
        the thread's failure if it has stopped."""
        handled = threading.Event() if wait else None
        with self._accepting:
            if self._ended:
                if request[0] == "close" or (request[0] == "abandon"):
                    return  # nothing runs that could still write
                raise self._stopped()
            self._posted.put((*request, handled))
        self.network.wake()
        if handled is not None:
            while not handled.wait(0.1):
                if not self._thread.is_alive():
                    return

    def _stopped(self) -> BroadcastError:
        if self._failure is not None:
            return BroadcastError(
                f"the multicast channel of {self._this_rank} has stopped: {self._failure}"
            )
        return BroadcastError(f"the multicast channel of {self._this_rank} is closed")

    # -- the thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                self._take_requests()
                if self._closing and time.monotonic() >= self._linger_until:
                    break
                self.network.receive(self._next_wakeup(), self._on_batch)
                now = time.monotonic()
                self._take_requests()
                if self._running is not None:
                    self._timers(now)
                    self._send(now)
                    self._finish_if_done()
        except BaseException as error:  # noqa: BLE001 - handed to every waiting caller
            self._failure = BroadcastError(
                f"the multicast thread of {self._this_rank} failed: {error!r}"
            )
            self._failure.__cause__ = error
        finally:  # nothing waits for an operation this thread will not run
            with self._accepting:
                self._ended = True
            self._drop_requests()
            self._fail_all(self._failure or self._stopped())
            self._stash, self._stash_bytes, self._stashed_ends = [], 0, set()

    def _drop_requests(self) -> None:
        """The requests queued before the thread stopped taking them: posts fail with the
        rest, the callers waiting for the others return."""
        for kind, operation, handled in self._queued_requests():
            if kind == "post":
                self._waiting.append(operation)
            if handled is not None:
                handled.set()

    def _fail_all(self, failure: BroadcastError) -> None:
        for operation in self._operations():
            operation._fail(failure)
        self._running = self._take = None  # the taker pins the running operation's buffers
        self._waiting.clear()

    def _operations(self) -> list[Operation]:
        running = [] if self._running is None else [self._running.operation]
        return running + list(self._waiting)

    def _queued_requests(self):
        """Each request queued so far, taken off the queue as it is handed out."""
        while True:
            try:
                yield self._posted.get_nowait()
            except queue.Empty:
                return

    def _take_requests(self) -> None:
        for kind, operation, handled in self._queued_requests():
            if kind == "post":
                self._waiting.append(operation)
            elif kind == "abandon":  # also after success: the caller leaves in any case
                if self._running is not None and self._running.operation is operation:
                    # done but not yet retired (the caller saw its last event first): a
                    # finished operation, whose END this rank must still acknowledge
                    self._retire(abandoned=not self._running.done)
                elif operation in self._waiting:
                    self._waiting.remove(operation)
            else:  # close: fail what is left, then linger (see LINGER_S)
                self._closing = True
                self._linger_until = self._linger_until_after(time.monotonic())
                if self._running is not None:
                    self._retire(abandoned=not self._running.done)
                self._fail_all(self._stopped())
            if handled is not None:
                handled.set()
        if self._running is None and self._waiting and not self._closing:
            self._start(self._waiting.popleft())

    def _start(self, operation: Operation) -> None:
        self._running = _Running(operation, self.rank, self.world_size, self.chunk_bytes)
        self._pace_rounds(self._running)
        if NATIVE_RECEIVE:
            self._take = self._running.native_taker(self.channel, self.rank, self.chunk_bytes)
        self._latest = operation.id
        # Replayed: this operation's. Kept: those of the next few, which a peer can be in
        # already where it left an operation this rank is still to start (a timeout, a
        # mismatch found beside the broadcasts). Dropped as stale: the rest, which no peer
        # reaches without this rank's payloads in between, and which would otherwise stay
        # (counted against STASH_BYTES) until the ids reached them.
        stash, self._stash, self._stash_bytes = self._stash, [], 0
        for operation_id, datagram in stash:
            if operation_id == operation.id:  # counted when it came; C takes it if it can
                self._take_run(memoryview(datagram), len(datagram))
            elif _shortly_after(operation_id, operation.id):
                self._stash.append((operation_id, datagram))
                self._stash_bytes += len(datagram)
            else:
                self.stats.stale += 1
        kept_ends = {end for end in self._stashed_ends if _shortly_after(end[0], operation.id)}
        self._stashed_ends = kept_ends
        self._finish_if_done()

    def _pace_rounds(self, running: _Running) -> None:
        """Pace this rank's broadcast for the round it sends in; while a root of the rounds
        before may still be sending (the token waits for one of them only), no faster than
        theirs: a smaller last round's faster pace would overflow the links with them."""
        index = running.position // self.options.concurrent_roots
        rounds = self.options.rounds(running.operation.order)[: index + 1]
        paces = [self.options.pace_bytes_per_s(roots, self.world_size) for roots in rounds]
        self._set_pace(min(paces))

    def _speed_up(self, running: _Running) -> None:
        """Once the roots not yet done here, this one included, are K or fewer, they are
        every root that may still send: paced for them alone, where that is faster. Never
        slower: a root left may be waiting for this one's token (K = 2 on racks: with 2
        and 3 done, 6 and 7 are left, in one rack, but 7 starts after 6), and with racks
        K > 2 rounds can already load one uplink beyond its share (module docstring)."""
        passed = len(running.passed)
        if passed == running.paced_for_passed:
            return
        running.paced_for_passed = passed
        if self.world_size - passed > self.options.concurrent_roots:
            return
        left = [root for root in running.operation.order if root not in running.passed]
        pace = self.options.pace_bytes_per_s(left, self.world_size)
        if pace > self._pace:
            self._set_pace(pace)

    def _set_pace(self, pace: float) -> None:
        self._pace = pace
        self._burst = max(
            4 * self._datagram_cost,
            min(pace * self.options.burst_s, MAX_BURST_BYTES),
        )

    def _retire(self, abandoned: bool = False) -> None:
        """Stop running the current operation; only a finished one is remembered (its END
        ACKed again). An abandoned one needs no record: its id is not newer than
        :attr:`_latest`, so :meth:`_other_operation` counts its datagrams stale."""
        if not abandoned:
            self._finished.append(self._running.operation.id)
        self._running = self._take = None

    def _finish_if_done(self) -> None:
        running = self._running
        if running is not None and running.done:
            for root in running.operation.order:
                running.operation._finish(root)
            self._retire()
            if self._waiting:
                self._start(self._waiting.popleft())

    def _next_wakeup(self) -> float:
        running = self._running
        if running is None or not self._posted.empty():
            if not self._posted.empty():
                return 0.0
            if self._closing:
                return max(0.0, min(IDLE_S, self._linger_until - time.monotonic()))
            return IDLE_S
        now = time.monotonic()
        due = min(
            [running.end_due]
            + [self._renack_due(i) for i in running.incoming.values() if i.end_seen and i.missing]
        )
        wakeup = due - now
        if self._has_data_to_send(running):
            need = self._next_send_bytes(running) - self._refill(now)
            wakeup = min(wakeup, need / self._pace)
        return min(IDLE_S, max(0.0, wakeup))

    # -- receiving ------------------------------------------------------------------------

    def _on_batch(self, batch: memoryview, size: int) -> None:
        """One read of one datagram or several of ``size`` bytes (the last may be shorter):
        each counted, and dropped at the injected loss rate (one draw each, in order); the
        running operation's DATA datagrams among the rest taken in C while it takes them,
        each other one in Python."""
        end = len(batch)
        size = size if size > 0 else max(end, 1)  # an empty datagram: refused as truncated
        count = max(1, -(-end // size))
        self.stats.datagrams_received += count
        if not self.options.loss:
            self._take_run(batch, size)
            return
        kept_from = 0  # the first datagram of the run not yet handed on
        for index in range(count):
            if self._losses.random() < self.options.loss:
                self.stats.injected_losses += 1
                if index > kept_from:
                    self._take_run(batch[kept_from * size : index * size], size)
                kept_from = index + 1
        if kept_from < count:
            self._take_run(batch[kept_from * size :], size)

    def _take_run(self, batch: memoryview, size: int) -> None:
        """Datagrams back to back, already counted: C first, Python for what it stops at."""
        start, end = 0, max(len(batch), 1)
        while start < end:
            take = self._take
            if take is not None:
                taken = take(batch[start:], size)
                if taken:
                    self.stats.taken_natively += taken
                    start += taken * size
                    self._native_arrivals(take.touched)
                    continue
            self._on_datagram(batch[start : start + size])
            start += size

    def _native_arrivals(self, touched: bytearray) -> None:
        """What the Python path does after each new chunk, once per root the C side wrote."""
        running, now = self._running, time.monotonic()
        root = touched.find(1)  # in C: a read touches a root or two, the group may be large
        while root >= 0:
            touched[root] = 0
            incoming = running.incoming[root]
            incoming.progress_at = now
            if incoming.missing == 0:
                self._received_all(running, root)
            root = touched.find(1, root + 1)

    def _on_datagram(self, view: memoryview) -> None:
        """One datagram (counted already, or replayed from the stash), in Python."""
        try:
            header, payload = parse(view)
        except Refused as refused:
            self.stats.refused[refused.reason] += 1
            return
        if header.channel != self.channel:
            self.stats.refused["channel"] += 1
            return
        if header.sender == self.rank:
            return  # our own multicast, looped back to another rank on this host
        if header.sender >= self.world_size or header.root >= self.world_size:
            self.stats.refused["rank"] += 1
            return
        if header.kind in (Kind.DATA, Kind.END) and header.sender != header.root:
            self.stats.refused["sender"] += 1  # only a root sends its DATA (repairs too), END
            return
        running = self._running
        if running is None or header.operation != running.operation.id:
            self._other_operation(header, view)
            return
        if header.kind is Kind.DATA:
            self._on_data(running, header, payload)
        elif header.kind is Kind.END:
            self._on_end(running, header)
        elif header.kind is Kind.NACK:
            self._on_nack(running, header, payload)
        else:
            self._on_ack(running, header)

    def _other_operation(self, header: Header, view: memoryview) -> None:
        if header.operation in self._finished:
            if header.kind is Kind.END:  # the root missed our ACK
                self._send_control(Kind.ACK, header.root, header.operation, to=header.root)
            elif header.kind is Kind.ACK:  # the answer to an END this rank repeated
                self.stats.late_acks += 1
            else:
                self.stats.stale += 1
            return
        later = self._latest is None or newer(header.operation, self._latest)
        if later and header.kind in (Kind.DATA, Kind.END):  # a faster peer's next operation
            end = (header.operation, header.root)
            if header.kind is Kind.END and end in self._stashed_ends:
                self.stats.duplicates += 1  # a repetition: replayed, each would be ACKed
                return
            if self._stash_bytes + len(view) > STASH_BYTES:
                self.stats.stash_dropped += 1
                return
            self._stash.append((header.operation, bytearray(view)))  # writable: C takes it
            self._stash_bytes += len(view)
            if header.kind is Kind.END:
                self._stashed_ends.add(end)
            self.stats.stashed += 1
            return
        self.stats.stale += 1  # an abandoned operation's too: no ACK for what is not here

    def _on_data(self, running: _Running, header: Header, payload: memoryview) -> None:
        incoming = running.incoming.get(header.root)
        if incoming is None:  # data of this rank's own broadcast: only a bug sends that
            self.stats.refused["root"] += 1
            return
        if header.count != incoming.count or header.chunk >= incoming.count:
            self.stats.refused["count"] += 1
            return
        if incoming.bitmap[header.chunk]:
            self.stats.duplicates += 1
            return
        start = header.chunk * incoming.chunk_bytes
        if len(payload) != incoming.length_of(header.chunk):
            self.stats.refused["length"] += 1
            return
        incoming.buffer[start : start + len(payload)] = payload
        incoming.bitmap[header.chunk] = 1
        incoming.missing -= 1
        incoming.progress_at = time.monotonic()
        if incoming.missing == 0:
            self._received_all(running, header.root)

    def _received_all(self, running: _Running, root: int) -> None:
        running.passed.add(root)
        self._send_control(Kind.ACK, root, running.operation.id, to=root)
        running.operation._finish(root)

    def _on_end(self, running: _Running, header: Header) -> None:
        incoming = running.incoming.get(header.root)
        if incoming is None or header.count != incoming.count:
            self.stats.refused["count"] += 1
            return
        running.passed.add(header.root)
        incoming.end_seen = True
        if incoming.missing == 0:
            self._send_control(Kind.ACK, header.root, running.operation.id, to=header.root)
        elif time.monotonic() >= self._renack_due(incoming):
            self._nack(running, header.root, incoming)  # the first gap report, or a retry
        elif incoming.bitmap.find(0, incoming.reported_to) >= 0:
            # gaps the last report had no room for: neither queued at the root nor in flight
            self._nack(running, header.root, incoming, after=incoming.reported_to)

    def _on_nack(self, running: _Running, header: Header, payload: memoryview) -> None:
        if header.root != self.rank:
            self.stats.refused["root"] += 1
            return
        if running.next_chunk < running.own_count:  # a receiver reports gaps after the END
            self.stats.refused["early"] += 1
            return
        try:
            ranges = unpack_ranges(payload)
        except Refused as refused:
            self.stats.refused[refused.reason] += 1
            return
        covered = 0  # chunks below this are queued: each looked at once, whatever the ranges
        for start, stop in sorted(ranges):
            stop = min(stop, running.own_count)
            for chunk in range(max(start, covered), stop):
                running.repairs[(header.sender, chunk)] = None
            covered = max(covered, stop)

    def _on_ack(self, running: _Running, header: Header) -> None:
        if header.root != self.rank:
            self.stats.refused["root"] += 1
            return
        if running.next_chunk < running.own_count:  # no receiver can have it all yet
            self.stats.refused["early"] += 1
            return
        running.acked.add(header.sender)
        if running.own_done:
            running.end_due = math.inf
            running.operation._finish(self.rank)

    # -- sending --------------------------------------------------------------------------

    def _timers(self, now: float) -> None:
        running = self._running
        for root, incoming in running.incoming.items():
            if incoming.end_seen and incoming.missing and now >= self._renack_due(incoming):
                self._nack(running, root, incoming)
        if now >= running.end_due:
            self._send_control(Kind.END, self.rank, running.operation.id, count=running.own_count)
            self.stats.ends_sent += 1
            running.end_due = now + self.options.retry_s

    def _renack_due(self, incoming: _Incoming) -> float:
        """When to report the gaps again: ``retry_s`` after the last report and the last
        new chunk, whichever came later. While repairs keep arriving the root is still
        working through the reports (this receiver's, and every other's ahead of it, which
        it keeps once each); once they stop, what is still missing was lost again."""
        if incoming.nacked_at == -math.inf:
            return -math.inf  # never reported: at once
        return max(incoming.nacked_at, incoming.progress_at) + self.options.retry_s

    def _nack(self, running: _Running, root: int, incoming: _Incoming, after: int = 0) -> None:
        """Report ``root``'s gaps from chunk ``after`` on: as many ranges as one datagram
        holds; an END that comes once they are repaired brings the report of the rest
        (:meth:`_on_end`)."""
        gaps = incoming.gaps(after)
        payload = pack_ranges(gaps, self.chunk_bytes)
        reported = len(payload) // RANGE_BYTES
        self._send_control(Kind.NACK, root, running.operation.id, to=root, payload=payload)
        self.stats.nacks_sent += 1
        incoming.nacked_at = time.monotonic()
        incoming.reported_to = gaps[reported - 1][1] if reported < len(gaps) else incoming.count

    def _may_start(self, running: _Running) -> bool:
        position = running.position - self.options.concurrent_roots
        return position < 0 or running.operation.order[position] in running.passed

    def _has_data_to_send(self, running: _Running) -> bool:
        if running.repairs:
            return True
        if not running.started:
            running.started = self._may_start(running)
        return running.started and running.next_chunk < running.own_count

    def _next_send_bytes(self, running: _Running) -> float:
        """The allowance worth waking up for: a repair (each goes alone) or the first chunk
        (a broadcast that waited for a batch's worth started up to a millisecond late: 4 MiB
        of int8 on 2 hosts took 1.24x as long), else a whole batch of the chunks left (one
        system call), within one bucket. Woken for one datagram, a root sent most chunks
        one system call each once its first bucket was spent."""
        cost = self._datagram_cost
        if running.repairs or running.next_chunk == 0:  # a broadcast starts at once
            return cost
        batch = min(self._batch_limit, running.own_count - running.next_chunk)
        return min(batch * cost, max(cost, self._burst))

    def _refill(self, now: float) -> float:
        self._allowance = min(self._burst, self._allowance + (now - self._refilled) * self._pace)
        self._refilled = now
        return self._allowance

    def _send(self, now: float) -> None:
        """Send what the pacing allows at ``now``: repairs first, each alone to its
        receiver, then the next chunks, multicast :attr:`_batch_limit` at a time.

        At most the bucket's allowance at ``now``, never refilled while sending: a thread
        that sends slower than its pace (a busy CPU) would otherwise refill as fast as it
        sends and not read its socket again until its whole payload had left, while the
        other roots' datagrams overflow its receive buffer. Nothing until the allowance
        holds what :meth:`_next_send_bytes` waits for (the thread runs this after each
        read too)."""
        running = self._running
        self._speed_up(running)
        cost = self._datagram_cost
        self._refill(now)
        repairing = bool(running.repairs)
        batch = []
        due = self._allowance >= self._next_send_bytes(running)
        while due and self._has_data_to_send(running) and self._allowance >= cost:
            if running.repairs:
                (to, chunk), _ = running.repairs.popitem(last=False)
                self.network.unicast(to, *self._data_datagram(running, chunk))
                self.stats.repairs_sent += 1
            else:
                batch.append(self._data_datagram(running, running.next_chunk))
                self.stats.data_sent += 1
                running.next_chunk += 1
                if len(batch) == self._batch_limit:
                    self.network.multicast_many(batch)
                    batch = []
            self._allowance -= cost
        if batch:
            self.network.multicast_many(batch)
        now = time.monotonic()
        sent_all = running.started and running.next_chunk == running.own_count
        first_or_repaired = running.end_due == math.inf or repairing
        if sent_all and not running.repairs and not running.own_done and first_or_repaired:
            running.end_due = now  # the END right after the last chunk or repair

    def _data_datagram(self, running: _Running, chunk: int) -> tuple[bytes, memoryview]:
        """``(head, payload)`` of this rank's chunk ``chunk``, counted as sent."""
        start = chunk * self.chunk_bytes
        payload = running.own[start : start + self.chunk_bytes]
        header = Header(
            Kind.DATA,
            self.rank,
            self.rank,
            self.channel,
            running.operation.id,
            chunk,
            running.own_count,
        )
        head = pack_header(header, payload)
        self._count_sent(len(head) + len(payload))
        return head, payload

    def _send_control(
        self, kind: Kind, root: int, operation: int, *, to=None, count=0, payload=b""
    ):
        header = Header(kind, self.rank, root, self.channel, operation, 0, count)
        head = pack_header(header, payload)
        if to is None:
            self.network.multicast(head, payload)
        else:
            self.network.unicast(to, head, payload)
        if kind is Kind.ACK:
            self.stats.acks_sent += 1
            self._acked_at = time.monotonic()
        self._count_sent(len(head) + len(payload))

    def _count_sent(self, nbytes: int) -> None:
        self.stats.datagrams_sent += 1
        self.stats.wire_bytes_sent += nbytes + FRAME_OVERHEAD
