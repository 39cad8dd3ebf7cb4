"""One executor for every schedule: encodes, the argument check, transfers and the overlap
of codec work with the transfer in flight, written once.

What each action of a schedule does to tensors is the business of a :class:`Payloads`
(:mod:`commpress.collectives.payloads`); what moves the bytes is the transport the
schedule names. The executor only orders them:

1. every ``ENCODE`` send is encoded up front, and a point-to-point schedule's first
   send leaves (:func:`first_send`), while the argument check
   (:class:`~commpress.collectives.fingerprint.Agreement`) is in flight; nothing is
   received or written to the output before it has passed;
2. a received payload is handled (decoded, added to, re-encoded) while the next step's
   transfer is on the wire, unless that step sends what the handling produces
   (:attr:`~commpress.schedules.Then.rewrites_payload`).
"""

from __future__ import annotations

from collections import deque
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from commpress.collectives.fingerprint import Agreement, EarlySend, Fingerprint
from commpress.schedules import Prepare, Receive, Schedule, Send, Step, Transport
from commpress.transport import collective, multicast, p2p

#: Steps in flight at once by default. With 1, a step is posted once the previous one has
#: arrived; more lets a pipelined schedule keep its link busy across the per-step latency.
WINDOW = 1


class Payloads(Protocol):
    """The tensors of one schedule's run and what each action does to them."""

    #: The encodes update caller-visible state (error feedback): check the arguments first.
    encodes_change_state: bool
    #: Where the collective's tensors live (the argument check runs there on NCCL).
    device: torch.device

    def encode_own(self, send: Send) -> None: ...
    def begin(self) -> None:
        """After the argument check, before the first transfer."""

    def send_buffer(self, send: Send) -> torch.Tensor: ...
    def receive_buffer(self, receive: Receive) -> torch.Tensor: ...
    def handle(self, receive: Receive) -> None:
        """The receive's ``then``, once its payload has arrived."""

    def gathered(self) -> torch.Tensor:
        """Every rank's payload, back to back (collective all-gather steps)."""

    def exchanged(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sent, received)``: one payload per rank each (collective all-to-all steps)."""


def execute(
    schedule: Schedule,
    payloads: Payloads,
    group: dist.ProcessGroup | None,
    timeout: timedelta | None,
    fingerprint: Fingerprint | None = None,
    window: int | None = None,
) -> None:
    """Run ``schedule`` on the calling thread. With ``fingerprint``, every rank first agrees
    on the arguments (:class:`~commpress.collectives.fingerprint.Agreement`): the check is
    started before the own payloads are encoded and waited for before anything is received
    or written to the output; a point-to-point schedule's first send leaves before it. Up to
    ``window`` steps (default :data:`WINDOW`) are in flight at once; received payloads are
    handled in step order, so the codec sees the same calls in the same order whatever the
    window."""
    window = WINDOW if window is None else window
    if schedule.transport is Transport.MULTICAST:
        window = len(schedule.steps)  # every broadcast posted at once; the transport paces
    agreement, announced = None, None
    if fingerprint is not None:
        if not payloads.encodes_change_state:
            announced = first_send(schedule, group)
        agreement = Agreement(group, fingerprint, timeout, payloads.device, announced)
        if payloads.encodes_change_state:
            agreement.check()
    for step in schedule.steps:
        for send in step.sends:
            if send.prepare is Prepare.ENCODE:
                payloads.encode_own(send)
    early = None  # the first step's send, posted with the argument check in flight
    if agreement is not None:
        if announced is not None:
            early = p2p.Batch(group, _sends(schedule.steps[0], payloads), [])
            agreement.sent_early(early)
        agreement.check()
    multicasts = schedule.transport is Transport.MULTICAST and bool(schedule.steps)
    if multicasts:  # the channel is set up (once) before anything touches the output
        broadcasts = multicast.Broadcasts(group, _broadcasts(schedule, payloads), timeout)
    payloads.begin()
    if multicasts:
        with broadcasts as posted:
            _run_steps(schedule, payloads, window, timeout, lambda step: posted.of(_root(step)))
        return

    def start(step: Step) -> _Transfer:
        nonlocal early
        if early is not None:  # the first step: its send is on its way, post its receives
            transfer, early = _Both(early, p2p.Batch(group, [], _receives(step, payloads))), None
            return transfer
        return _start(schedule.transport, step, payloads, group)

    _run_steps(schedule, payloads, window, timeout, start)


def _run_steps(schedule: Schedule, payloads: Payloads, window: int, timeout, start) -> None:
    """Post each step's transfer (``start(step)``), at most ``window`` in flight, and handle
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

    for step in schedule.steps:
        make_ready({_key(s) for s in step.sends if s.prepare is Prepare.FORWARD})
        while len(in_flight) >= window:
            complete_oldest()
        in_flight.append((start(step), step))
        while arrived:  # overlaps with the transfers in flight
            payloads.handle(arrived.popleft())
    while in_flight:
        complete_oldest()
        while arrived:
            payloads.handle(arrived.popleft())


def first_send(schedule: Schedule, group) -> EarlySend | None:
    """The payload this rank may send before the argument check has passed: the first step's
    one send of a point-to-point schedule, to one peer (announced in the fingerprint, so that
    a mismatched peer can drain it)."""
    if schedule.transport is not Transport.P2P or not schedule.steps:
        return None
    sends = schedule.steps[0].sends
    if len(sends) != 1 or len(sends[0].dsts) != 1 or not p2p.sends_may_go_alone(group):
        return None
    return EarlySend(sends[0].dsts[0], sends[0].wire_bytes)


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
    def wait(self, timeout: timedelta | None) -> None: ...


class _Both:
    def __init__(self, *transfers: _Transfer):
        self._transfers = transfers

    def wait(self, timeout: timedelta | None) -> None:
        for transfer in self._transfers:
            transfer.wait(timeout)


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
    sent, received = payloads.exchanged()
    return p2p.Pending(collective.all_to_all(received, sent, group))
