"""One executor for every schedule: encodes, the argument check, transfers and the overlap
of codec work with the transfer in flight, written once.

What each action of a schedule does to tensors is the business of a :class:`Payloads`
(:mod:`commpress.collectives.payloads`); what moves the bytes is the transport the
schedule names. The executor only orders them:

1. every ``ENCODE`` send is encoded up front (overlapping the argument check of
   :class:`~commpress.collectives.fingerprint.Agreement`, which ``gate`` waits for);
2. a received payload is handled (decoded, added to, re-encoded) while the next step's
   transfer is on the wire, unless that step sends what the handling produces.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from commpress.schedules import Prepare, Receive, Schedule, Send, Step, Transport
from commpress.transport import collective, p2p


class Payloads(Protocol):
    """The tensors of one schedule's run and what each action does to them."""

    #: The encodes update caller-visible state (error feedback): check the arguments first.
    encodes_change_state: bool

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
    gate: Callable[[], None] | None = None,
) -> None:
    """Run ``schedule`` on the calling thread. ``gate`` runs after the own payloads are
    encoded and before anything is sent or written to the output."""
    gate = gate or (lambda: None)
    if payloads.encodes_change_state:
        gate()
    for step in schedule.steps:
        for send in step.sends:
            if send.prepare is Prepare.ENCODE:
                payloads.encode_own(send)
    gate()
    payloads.begin()
    pending: list[Receive] = []
    for step in schedule.steps:
        forwarded = {(s.chunk, s.piece) for s in step.sends if s.prepare is Prepare.FORWARD}
        for receive in pending:  # what this step sends must be ready before it leaves
            if (receive.chunk, receive.piece) in forwarded:
                payloads.handle(receive)
        pending = [r for r in pending if (r.chunk, r.piece) not in forwarded]
        transfer = _start(schedule.transport, step, payloads, group)
        for receive in pending:  # overlaps with the transfer in flight
            payloads.handle(receive)
        transfer.wait(timeout)
        pending = list(step.receives)
    for receive in pending:
        payloads.handle(receive)


class _Collective:
    def __init__(self, work):
        self._work = work

    def wait(self, timeout: timedelta | None) -> None:
        p2p.wait(self._work, timeout)


def _start(transport: Transport, step: Step, payloads: Payloads, group):
    if transport is Transport.P2P:
        sends = [(payloads.send_buffer(s), dst) for s in step.sends for dst in s.dsts]
        receives = [(payloads.receive_buffer(r), r.src) for r in step.receives]
        return p2p.Batch(group, sends, receives)
    if transport is Transport.ALL_GATHER:
        (own,) = step.sends
        work = collective.all_gather(payloads.gathered(), payloads.send_buffer(own), group)
        return _Collective(work)
    sent, received = payloads.exchanged()
    return _Collective(collective.all_to_all(received, sent, group))
