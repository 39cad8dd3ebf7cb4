"""One executor for every schedule: encodes, the argument check, transfers and the overlap
of codec work with the transfer in flight, written once.

What each action of a schedule does to tensors is the business of a :class:`Payloads`
(:mod:`commpress.collectives.payloads`); what moves the bytes is the transport the
schedule names (but on gloo, from :data:`POINT_TO_POINT_FROM_BYTES` per peer, the
backend's all-to-all, and its all-gather of two ranks, are posted point to point). The
executor only orders them:

1. the argument check: for CPU tensors on gloo carried in the messages themselves
   (:mod:`commpress.collectives.inband`: a ring's payloads carry it, any other schedule
   first sends a header alone and takes an all-reduce's verdict), elsewhere one all-reduce
   (:class:`~commpress.collectives.fingerprint.Agreement`) in flight while the own
   payloads are encoded; either way nothing is written to the output before it has passed;
2. a received payload is handled (decoded, added to, re-encoded) while the next step's
   transfer is on the wire, unless that step sends what the handling produces
   (:attr:`~commpress.schedules.Then.rewrites_payload`); with the in-band check, the
   writes into the output (an all-gather's decodes) wait for the last step's header
   instead (sent alone, ahead of its shard, from :data:`SPLIT_LAST_BYTES`), or, on
   :data:`EARLY_VERDICT_MIN_RANKS` ranks or more, for an early verdict
   (:data:`EARLY_VERDICT_BYTES`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from commpress._torch_private import group_timeout
from commpress.collectives import fingerprint as fingerprints
from commpress.collectives import inband
from commpress.collectives.checks import LONGEST_TIMEOUT
from commpress.collectives.fingerprint import Agreement, Fingerprint
from commpress.collectives.workspace import workspace
from commpress.schedules import Prepare, Receive, Schedule, Send, Step, Transport
from commpress.schedules.wire import carries_check
from commpress.transport import backends, collective, multicast, p2p

#: Output bytes from which a chain whose writes to the output are held (an all-gather)
#: on :data:`EARLY_VERDICT_MIN_RANKS` ranks or more also takes an all-reduce's verdict, to
#: release them as soon as it says every rank agrees: above this size the decodes that
#: holding them serialises at the end cost more than the all-reduce
#: (``benchmarks/check_overlap_2026-11-25/README.md``).
EARLY_VERDICT_BYTES = 8 << 20

#: Ranks from which the early verdict is taken; below, the last header travels alone
#: (:data:`SPLIT_LAST_BYTES`) at any size, and the ``n - 2`` held decodes overlap the last
#: shard's transfer. On 4 emulated hosts at 1 Gbit/s and 16 MiB the split cost nothing
#: measurable where the all-reduce cost about 1 ms; on 8 the two measured the same; other
#: world sizes and faster links (where a shard's transfer can be shorter than the decodes
#: it has to hide) were not measured.
EARLY_VERDICT_MIN_RANKS = 8

#: Output bytes from which a chain whose writes are held (an all-gather) sends its last
#: header alone, ahead of the last shard, to write the output while that shard is on the
#: wire (unless it takes the early verdict): below it, the extra message costs more than
#: the overlap wins (on 4 emulated hosts: more at 1 and 2 MiB, less at 3 and 4;
#: ``benchmarks/check_overlap_2026-11-25/``).
SPLIT_LAST_BYTES = 3 << 20

#: A multicast all-gather's argument check runs while its broadcasts are on the wire (from
#: a group's second multicast call on); False: before they are posted, as every other
#: non-chain schedule's.
CHECK_BESIDE_BROADCASTS = True

#: Payload bytes per peer from which, on gloo (CPU tensors, a backend other than NCCL), a
#: step that names one of the backend's collectives is posted as point-to-point sends and
#: receives, every receive before any send, where gloo's own would post a send before its
#: receive between two ranks: every all-to-all, and the all-gather on two ranks (gloo's
#: ring is then one exchange with one peer). Below it, and where this is None, gloo's own.
#: gloo's all-to-all posts, peer by peer, a send before the receive (``gloo/alltoall.cc``):
#: on two ranks both post their send first, an exchange gloo serialises
#: (``benchmarks/two_ranks_2026-11-27/README.md``). From this size, the all-to-all point to
#: point was up to 1.8x faster on two emulated hosts and 1.4x on four (why on more than two
#: was not established), on eight within the noise; below it, at times slower (one call
#: against 2(n - 1) posts from Python; ``benchmarks/alltoall_p2p_2026-12-07/README.md``).
POINT_TO_POINT_FROM_BYTES: int | None = 256 << 10

#: Steps in flight at once for the pieces of an all-to-all (``alltoall``): a piece is summed
#: while the next one is on the wire.
PIECES_IN_FLIGHT = 2

#: Steps in flight at once by default. With 1, a step is posted once the previous one has
#: arrived (a chain on gloo still posts each receive one step ahead); more lets a
#: pipelined schedule keep its link busy across the per-step latency.
WINDOW = 1


class Payloads(Protocol):
    """The tensors of one schedule's run and what each action does to them."""

    #: The encodes update caller-visible state (error feedback): check the arguments first.
    encodes_change_state: bool
    #: Each encode gives the same bits whatever the order of the call's encodes, and changes
    #: nothing else (no noise drawn, no error fed back): an all-to-all's pieces may then be
    #: encoded as they are posted (read for all-to-all schedules only).
    encodes_in_any_order: bool
    #: Where the collective's tensors live (the argument check runs there on NCCL).
    device: torch.device

    def encode_own(self, send: Send) -> None: ...
    def begin(self) -> None:
        """After the argument check, once the first transfer is posted (its work overlaps
        that transfer); in a chain that carries the check, before it."""

    def send_buffer(self, send: Send) -> torch.Tensor: ...
    def receive_buffer(self, receive: Receive) -> torch.Tensor: ...
    def send_message(self, send: Send) -> torch.Tensor:
        """The send buffer with room for a header in front (point-to-point schedules)."""

    def receive_message(self, receive: Receive) -> torch.Tensor: ...
    def move_message(self, receive: Receive, message: torch.Tensor) -> None:
        """Receive into ``message`` (as large as :meth:`receive_message`) instead, and keep
        the payload there for the rest of the run."""

    def hold(self) -> None:
        """Write nothing to the output until :meth:`release` (in-band check)."""

    #: The output bytes that :meth:`hold` keeps back (0 where nothing is held).
    held_bytes: int

    def release(self) -> None: ...
    def handle(self, receive: Receive) -> None:
        """The receive's ``then``, once its payload has arrived."""

    def gathered(self) -> torch.Tensor:
        """Every rank's payload, back to back (collective all-gather steps)."""

    def exchanged(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sent, received)`` of ``step``: one payload per rank each (collective
        all-to-all steps)."""


def execute(
    schedule: Schedule,
    payloads: Payloads,
    group: dist.ProcessGroup | None,
    timeout: timedelta | p2p.Deadline | None,
    fingerprint: Fingerprint | None = None,
    window: int | None = None,
) -> None:
    """Run ``schedule`` on the calling thread. With ``fingerprint``, every rank first agrees
    on the arguments, and every rank raises
    :class:`~commpress.collectives.fingerprint.CollectiveMismatchError` if any differs,
    before anything is written to the output. Up to ``window`` steps (default
    :data:`WINDOW`) are in flight at once; received payloads are handled in step order, so
    the codec sees the same calls in the same order whatever the window. ``timeout``
    bounds the call's waits together, as torch's bounds its collective (a multicast's
    broadcasts keep their own: :class:`~commpress.transport.multicast.Broadcasts`); a
    :class:`~commpress.transport.p2p.Deadline` already running bounds it together with the
    other steps of the call that share it (an all-reduce's two halves)."""
    if window is None:
        window = PIECES_IN_FLIGHT if _pieces_alone(schedule) else WINDOW
    deadline = call_deadline(timeout, group, payloads.device)
    if deadline is not None:
        timeout = deadline.timeout  # the multicast's own
    multicasts = schedule.transport is Transport.MULTICAST and bool(schedule.steps)
    transport = _posted_transport(schedule, payloads, group)
    settle, call = None, None  # waits for the argument check, raising on a mismatch
    if fingerprint is not None and inband.applies(group, payloads.device):
        chains = carries_check(schedule, window)
        several = len(schedule.steps) > 1  # with one, nothing is left to overlap at the verdict
        early = (
            chains
            and several
            and payloads.held_bytes >= EARLY_VERDICT_BYTES
            and schedule.world_size >= EARLY_VERDICT_MIN_RANKS
        )
        split = chains and several and not early and payloads.held_bytes >= SPLIT_LAST_BYTES
        sizes = schedule.wire_sizes
        check = inband.Check(
            group,
            fingerprint,
            deadline,
            payloads.device,
            chains,
            early,
            sizes,
            split,
            point_to_point=transport is not schedule.transport,
        )
        if chains:
            _execute_in_band(schedule, payloads, group, deadline, check)
            return
        check.post_header()
        settle, call = check.settle, check.sequence
    elif fingerprint is not None:
        agreement = Agreement(group, fingerprint, deadline, payloads.device)
        settle, call = agreement.check, agreement.sequence
    if multicasts:
        _execute_multicast(schedule, payloads, group, timeout, settle, call)
        return
    if settle is not None and payloads.encodes_change_state:
        settle()
    as_posted = _pieces_alone(schedule) and payloads.encodes_in_any_order
    _encode_own(payloads, schedule.steps[:1] if as_posted else schedule.steps)
    if settle is not None:
        settle()
    if schedule.steps and window == 1 and _may_receive_ahead(schedule, payloads, group):
        # the own payloads are written to the output while the first transfer is on the wire
        _run_steps(schedule, payloads, 1, deadline, _chain_ahead(schedule, payloads, group))
        return

    def start(k: int, step: Step) -> _Transfer:
        if as_posted and k > 0:  # while the pieces before it are on the wire
            _encode_own(payloads, (step,))
        transfer = _start(transport, step, payloads, group)
        if k == 0:
            payloads.begin()  # the own shard's decode, while the first transfer is on the wire
        return transfer

    if not schedule.steps:
        payloads.begin()
    _run_steps(schedule, payloads, window, deadline, start)


def call_deadline(
    timeout: timedelta | p2p.Deadline | None, group, device: torch.device
) -> p2p.Deadline | None:
    """The deadline of a call given ``timeout``, from now on (a running one stays itself).
    Given none, where gloo moves the tensors: the group's own timeout, for the whole call
    as an explicit one (each wait given the group's whole timeout, a peer late at every
    step stretched a call past it without a word). Elsewhere (NCCL) none stays none: each
    wait as the backend's, which a timeout would change (docs/collectives.md, On NCCL)."""
    if timeout is None and (group is not None or dist.is_initialized()):
        group = backends.or_world(group)
        if backends.moves(group, device.type) == "gloo":
            own = group_timeout(group)
            # longer ones are gloo's to overflow on (checks.LONGEST_TIMEOUT), not ours
            timeout = own if own is not None and own <= LONGEST_TIMEOUT else None
    return p2p.Deadline.of(timeout)


def _execute_multicast(
    schedule: Schedule,
    payloads: Payloads,
    group,
    timeout,
    settle: Callable[[], None] | None,
    call: int | None,
) -> None:
    """Every broadcast of the schedule posted at once (the transport paces them and passes
    the token between roots), the payloads received handled as they complete.

    The argument check settles while the broadcasts are on the wire
    (:data:`CHECK_BESIDE_BROADCASTS`): they land in buffers of their own, and nothing is
    written to the output before it has passed; on a mismatch every rank leaves the
    operation. Not on a group's first multicast call: setting its channel up is itself
    collective, so only once every rank is known to multicast. The operation's id is the
    call's sequence number on the group (``call``), the same on every rank whatever each
    called, so a rank that called another compressed algorithm leaves no channel out of
    step (``native`` takes no number). CUDA payloads travel through host buffers
    (:func:`stages_through_host`)."""
    if call is None:  # an unchecked call still takes its number in the group's sequence
        call = fingerprints.next_sequence(backends.or_world(group))
    beside = CHECK_BESIDE_BROADCASTS and multicast.is_set_up(group)
    if settle is not None and payloads.encodes_change_state:
        settle()
    _encode_own(payloads, schedule.steps)  # while the check is in flight
    if settle is not None and not beside:
        settle()
    buffers = _broadcasts(schedule, payloads)
    staged = buffers
    if stages_through_host(payloads.device):
        staged = _staged_through_host(buffers, schedule.rank)
    with multicast.Broadcasts(group, staged, call, timeout) as posted:
        if settle is not None:
            settle()  # at once where it has settled already
        payloads.begin()

        def start(k: int, step: Step) -> _Transfer:
            root = _root(step)
            if staged is buffers or not step.receives:
                return posted.of(root)
            return _CopiedIn(posted.of(root), staged[root], buffers[root])

        _run_steps(schedule, payloads, len(schedule.steps), timeout, start)


def stages_through_host(device: torch.device) -> bool:
    """Whether the multicast's payloads on ``device`` travel through copies in host memory
    (CUDA tensors: the transport moves host memory)."""
    return device.type != "cpu"


def _staged_through_host(buffers: dict[int, torch.Tensor], own: int) -> dict[int, torch.Tensor]:
    """A host buffer for each root's payload, in the same order, the ``own`` one filled (the
    copy waits for the encode queued on the current stream, as any blocking device-to-host
    copy does)."""
    sizes = [buffer.numel() for buffer in buffers.values()]
    staged = dict(zip(buffers, workspace.take_pieces("multicast.host", sizes, "cpu"), strict=True))
    staged[own].copy_(buffers[own])
    return staged


class _CopiedIn:
    """A broadcast received into host memory, copied into the payload's own buffer once it
    has arrived (before it is decoded)."""

    def __init__(self, broadcast, host: torch.Tensor, device: torch.Tensor):
        self._broadcast, self._host, self._device = broadcast, host, device

    def wait(self, timeout: timedelta | p2p.Deadline | None) -> None:
        self._broadcast.wait(timeout)
        self._device.copy_(self._host)


def _encode_own(payloads: Payloads, steps: Sequence[Step]) -> None:
    """Every payload of the own data in ``steps``, by chunk, then piece: the pieces of a
    chunk draw stochastic rounding's noise in the order its whole would (an all-to-all's
    pieces are steps of their own), so a call's bits do not depend on ``chunk_bytes`` where
    its pieces fall on the codec's blocks."""
    sends = [send for step in steps for send in step.sends]
    for send in sorted(sends, key=_key):
        if send.prepare is Prepare.ENCODE:
            payloads.encode_own(send)


def _execute_in_band(schedule: Schedule, payloads, group, timeout, check: inband.Check) -> None:
    """A ring whose messages carry the argument check; ``out`` written once the last
    header has come (from :data:`SPLIT_LAST_BYTES`, ahead of the rest of its message:
    :meth:`~commpress.collectives.inband.Check.wire`), or once an early verdict has said
    that every rank agrees."""
    if check.early:
        check.post_early_verdict()
    _encode_own(payloads, schedule.steps)
    payloads.hold()
    payloads.begin()
    steps = schedule.steps
    scratch = check.first_scratch()
    first = steps[0].receives[0]
    expected = payloads.receive_message(first).numel()
    if expected <= inband.FIRST_MESSAGE_BYTES:  # the payload stays where it arrives
        payloads.move_message(first, scratch[:expected])
    messages = [payloads.send_message(step.sends[0]) for step in steps]
    # each later receive is posted one step ahead (:class:`_ReceivesAhead`), from the
    # moment the left neighbour's first header has agreed (before that, a message of a
    # size this rank does not expect could end the process)
    last = len(steps) - 1
    ahead = _ReceivesAhead(steps, payloads.receive_message, group, check.wire)

    def start(k: int, step: Step) -> _Transfer:
        check.stamp(messages[k], messages[k + 1] if k < last else None)
        if k == 0:
            into = payloads.receive_message(step.receives[0])
            return _FirstMessage(check, messages[0], scratch, into, lambda: ahead.post(1))
        into, received = ahead.take(k)
        parts = check.wire(messages[k], k == last)
        sent = p2p.Batch(group, [(part, check.right) for part in parts], [])
        ahead.post(k + 1)
        if check.early and not check.poisoned and check.agreed_early():
            payloads.release()  # the held decodes, while this transfer is in flight
        return _Noted(check, received, sent, into, payloads.release)

    try:
        _run_steps(schedule, payloads, 1, timeout, start)
    except inband.LeftDisagrees as disagreement:
        check.disagree(disagreement.header, messages[1:], disagreement.pending)
    if check.poisoned:
        check.raise_mismatch()
    check.finish()
    payloads.release()


class _ReceivesAhead:
    """The receives of a chain (one receive from the left neighbour per step), each posted
    one step ahead: gloo moves a point-to-point message only once its receive is posted
    (``benchmarks/small_messages_2026-11-26/README.md``), so a receive posted after the
    sender's send leaves the link idle. After a failure (a timeout, a peer gone) one
    receive may stay posted: as after any failed collective, the group is not to be used
    again."""

    def __init__(self, steps, buffer: Callable[[Receive], torch.Tensor], group, wire=None):
        """``buffer``: where a step's receive lands; ``wire(buffer, last)``: the parts it
        arrives in, each received on its own (default: whole)."""
        self._steps, self._buffer, self._group = steps, buffer, group
        self._wire = wire or (lambda buffer, last: [buffer])
        self._posted: dict[int, tuple[torch.Tensor, list[p2p.Batch]]] = {}  # step -> receives

    def post(self, k: int) -> None:
        """Post step ``k``'s receive (none past the last step)."""
        if k < len(self._steps):
            (receive,) = self._steps[k].receives
            into = self._buffer(receive)
            parts = self._wire(into, k == len(self._steps) - 1)
            self._posted[k] = into, [p2p.Batch(self._group, [], [(p, receive.src)]) for p in parts]

    def take(self, k: int) -> tuple[torch.Tensor, list[p2p.Batch]]:
        """Step ``k``'s receive, posted earlier: ``(its buffer, the batch of each part)``."""
        return self._posted.pop(k)


def _may_receive_ahead(schedule: Schedule, payloads: Payloads, group) -> bool:
    """Whether an unchecked schedule posts each receive a step ahead: a chain
    (:attr:`~commpress.schedules.steps.Schedule.chains_right`) of CPU tensors, on a
    transport that posts sends alone (gloo; NCCL wants each step's send and receive in one
    group)."""
    if not schedule.chains_right or payloads.device.type != "cpu":
        return False
    return p2p.sends_may_go_alone(group)


def _chain_ahead(schedule: Schedule, payloads: Payloads, group) -> Callable[..., _Transfer]:
    """The ``start`` of an unchecked chain: step ``k`` posts its send, then step ``k + 1``'s
    receive; the first step posts its own receive first, and begins the payloads
    (:meth:`Payloads.begin`) once its transfers are posted."""
    ahead = _ReceivesAhead(schedule.steps, payloads.receive_buffer, group)

    def start(k: int, step: Step) -> _Transfer:
        if k == 0:
            ahead.post(0)
        _, (received,) = ahead.take(k)
        (send,) = step.sends
        sent = p2p.Batch(group, [(payloads.send_buffer(send), send.dsts[0])], [])
        ahead.post(k + 1)
        if k == 0:
            payloads.begin()
        return _Both(received, sent)

    return start


class _Both:
    """A step's receive and send, waited in that order."""

    def __init__(self, received: p2p.Batch, sent: p2p.Batch):
        self._received, self._sent = received, sent

    def wait(self, timeout: timedelta | p2p.Deadline | None) -> None:
        self._received.wait(timeout)
        self._sent.wait(timeout)


class _FirstMessage:
    """The first message each way: received into a buffer no first message outgrows."""

    def __init__(
        self,
        check: inband.Check,
        message: torch.Tensor,
        scratch: torch.Tensor,
        into: torch.Tensor,
        agreed: Callable[[], None],
    ):
        """``into``: where the schedule wants the message; ``scratch`` itself when it fits.
        ``agreed``: called once the left neighbour's first header has agreed (and the rest
        of its first message, if cut, has arrived)."""
        self._check, self._scratch, self._into, self._agreed = check, scratch, into, agreed
        first, self._rest = check.send_first(message)
        # the receive first: gloo's sender waits for it to be posted
        self._received = p2p.Batch(check.group, [], [(scratch, check.left)])
        self._sent = p2p.Batch(check.group, [(first, check.right)], [])
        # on two ranks the rests are one exchange with one peer, which gloo at times
        # serialises when both sides post their sends before their receives
        # (``benchmarks/two_ranks_2026-11-27/``): there the rest is sent once the left's
        # rest has its receive; on more ranks the two go to different peers, and the rest
        # is posted now
        self._rest_sent = None
        if check.left != check.right:
            self._rest_sent = self._send_rest()

    def wait(self, timeout: timedelta | p2p.Deadline | None) -> None:
        self._received.wait(timeout)
        try:
            rest_received = self._check.accept_first(self._scratch, self._into)
        except inband.LeftDisagrees as disagreement:
            # the first part lands in the right neighbour's scratch, posted at its start;
            # the rest only once it has drained its own left: wait for that once this rank
            # has drained its own (a cycle otherwise)
            self._sent.wait(timeout)
            disagreement.pending = self._send_rest()
            raise
        rest_sent = self._send_rest()
        if rest_received is not None:
            rest_received.wait(timeout)
        self._agreed()  # before this rank's own send is waited: the next receive is ready
        self._sent.wait(timeout)
        if rest_sent is not None:
            rest_sent.wait(timeout)

    def _send_rest(self) -> p2p.Batch | None:
        """This rank's rest, posted now if it was not yet (``None``: there is none)."""
        if self._rest is None:
            return None
        if self._rest_sent is None:
            self._rest_sent = p2p.Batch(self._check.group, [(self._rest, self._check.right)], [])
        return self._rest_sent


class _Noted:
    """A later message: its header's poison is noted once it has arrived. The last one's
    header, travelling alone, completes the verdict: when no poison has come, the output is
    released while the rest of the message is still on the wire."""

    def __init__(self, check, received: list[p2p.Batch], sent: p2p.Batch, into, release):
        self._check, self._received, self._sent = check, received, sent
        self._into, self._release = into, release

    def wait(self, timeout: timedelta | p2p.Deadline | None) -> None:
        header, *rest = self._received
        header.wait(timeout)
        self._check.note(self._into)
        if rest and not self._check.poisoned:
            self._release()
        for batch in (*rest, self._sent):
            batch.wait(timeout)


def _run_steps(schedule: Schedule, payloads: Payloads, window: int, timeout, start) -> None:
    """Post each step's transfer (``start(index, step)``), at most ``window`` in flight, and handle
    what arrives in step order, overlapped with the transfers still in flight."""
    in_flight: deque[tuple[_Transfer, Step]] = deque()
    arrived: deque[Receive] = deque()  # not handled yet, in step order

    def complete_oldest() -> None:
        transfer, step = in_flight.popleft()
        transfer.wait(timeout)
        arrived.extend(step.receives)

    def make_ready(keys: set) -> None:
        """Wait for the chunk pieces in ``keys`` (what this step forwards) to arrive; where
        the handling of one rewrites its payload, handle, in order, every arrived receive up
        to it. A payload forwarded as it came is decoded later, during the transfer."""
        while any(_key(r) in keys for _, step in in_flight for r in step.receives):
            complete_oldest()
        rewritten = [
            i for i, r in enumerate(arrived) if _key(r) in keys and r.then.rewrites_payload
        ]
        for _ in range(max(rewritten, default=-1) + 1):
            payloads.handle(arrived.popleft())

    for index, step in enumerate(schedule.steps):
        make_ready({_key(s) for s in step.sends if s.prepare is Prepare.FORWARD})
        while len(in_flight) >= window:
            complete_oldest()
        in_flight.append((start(index, step), step))
        while arrived:  # overlaps with the transfers in flight
            payloads.handle(arrived.popleft())
    while in_flight:
        complete_oldest()
        while arrived:
            payloads.handle(arrived.popleft())


def _root(step: Step) -> int:
    """The rank whose broadcast a multicast step is."""
    return step.receives[0].src if step.receives else step.sends[0].chunk


def _broadcasts(schedule: Schedule, payloads: Payloads) -> dict[int, torch.Tensor]:
    """Each root's payload buffer, in the schedule's order: the own one to send, the others
    to receive into."""
    buffers = {}
    for step in schedule.steps:
        for send in step.sends:
            buffers[send.chunk] = payloads.send_buffer(send)
        for receive in step.receives:
            buffers[receive.src] = payloads.receive_buffer(receive)
    return buffers


def _key(transfer: Send | Receive) -> tuple[int, int]:
    return transfer.chunk, transfer.piece


class _Transfer(Protocol):
    def wait(self, timeout: timedelta | p2p.Deadline | None) -> None: ...


def _sends(step: Step, payloads: Payloads) -> list[tuple[torch.Tensor, int]]:
    return [(payloads.send_buffer(s), dst) for s in step.sends for dst in s.dsts]


def _receives(step: Step, payloads: Payloads) -> list[tuple[torch.Tensor, int]]:
    return [(payloads.receive_buffer(r), r.src) for r in step.receives]


def _start(transport: Transport, step: Step, payloads: Payloads, group):
    if transport is Transport.P2P:
        return p2p.Batch(group, _sends(step, payloads), _receives(step, payloads))
    if transport is Transport.ALL_GATHER:
        (own,) = step.sends
        work = collective.all_gather(payloads.gathered(), payloads.send_buffer(own), group)
        return p2p.Pending(work)
    sent, received = payloads.exchanged(step)
    return p2p.Pending(collective.all_to_all(received, sent, group))


def _pieces_alone(schedule: Schedule) -> bool:
    """Whether ``schedule`` is an all-to-all in several pieces (no step waits for what an
    earlier one received)."""
    return schedule.transport is Transport.ALL_TO_ALL and len(schedule.steps) > 1


def _posted_transport(schedule: Schedule, payloads: Payloads, group) -> Transport:
    """What moves the schedule's payloads: the transport it names, but point to point where
    :func:`point_to_point_on_gloo` says so and gloo moves them (CPU tensors)."""
    if (
        point_to_point_on_gloo(schedule)
        and payloads.device.type == "cpu"
        and p2p.sends_may_go_alone(group)
    ):
        return Transport.P2P
    return schedule.transport


def point_to_point_on_gloo(schedule: Schedule) -> bool:
    """Whether gloo (CPU tensors) gets ``schedule``'s payloads posted point to point: the
    backend's all-to-all, or its all-gather on two ranks, whose first step's payloads reach
    :data:`POINT_TO_POINT_FROM_BYTES` per peer (the largest: a last piece may be smaller)."""
    least = POINT_TO_POINT_FROM_BYTES
    exchange = schedule.transport is Transport.ALL_TO_ALL or (
        schedule.transport is Transport.ALL_GATHER and schedule.world_size == 2
    )
    return (
        exchange
        and least is not None
        and bool(schedule.steps)
        and schedule.steps[0].sends[0].wire_bytes >= least
    )
