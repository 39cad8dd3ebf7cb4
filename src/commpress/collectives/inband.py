"""The argument check on gloo (CPU tensors, any backend but NCCL), carried in the payload
messages themselves.

Every checked collective starts with a message from each rank to its right neighbour in
the ring, opening with a :data:`HEADER_BYTES` header: the digest of the
sender's arguments (:func:`~commpress.collectives.fingerprint.digest`), a poison flag, the
size of this message and of the sender's next one. A ring schedule (a *chain*,
:attr:`~commpress.schedules.steps.Schedule.chains_right`) carries its payloads in such
messages, every one with a header, so the check sends no message of its own; any other
schedule sends one header alone (the first message of every rank must be one, whatever
its algorithm), then takes every rank's verdict from one all-reduce of the digests.

Why no rank can end another: gloo ends the process whose posted receive is *smaller* than
the message that arrives, and accepts a smaller message. Every rank posts its first
receive into a buffer of :data:`FIRST_MESSAGE_BYTES`, and no first message is larger (a
longer first payload continues in a second message). From the first header on, a rank
knows whether its left neighbour agrees: if so, every later message should be the size
its own schedule says (a header that says otherwise poisons, a larger message would still
end the process); if not, the headers announce each next size, and the rank receives and
drops them all (after a header that says it travelled alone, the rest of its message
too). :data:`FIRST_MESSAGE_BYTES` must be the same on every rank: a rank whose first
receive is smaller than a peer's cut can still be ended by gloo.

Why every rank learns of a mismatch: a rank whose left neighbour disagrees poisons every
message it sends, and so does every rank that has received a poisoned one. Among ranks
that all run chains, a cycle with any disagreement has at least two ranks whose left
neighbour disagrees, and the poison of each reaches every rank but its own left neighbour
within the ``n - 1`` rounds (each round's message leaves after the previous round's has
arrived). Where some ranks run other schedules, each stretch of chain ranks starts with a
rank whose left neighbour differs, and its poison reaches the whole stretch; the other
ranks learn from the all-reduce, which every poisoned rank joins. Until the last round's
header has come, nothing is written to the output
(:meth:`~commpress.collectives.payloads.Gathered.hold`); an all-gather of
:data:`~commpress.collectives.executor.SPLIT_LAST_BYTES` of output or more on three ranks
or more (but those that take the early verdict, below) sends that header alone, ahead of
its last shard (:meth:`Check.wire`), so that the output is written while the shard is on
the wire; a failure after that (a peer that dies or stalls) can leave the output partly
written, as a failing torch collective does.
This holds for arguments the digest sees; a setting outside them that changes only the
later messages' sizes may be noticed by one rank alone, and its peers then time out.

An all-gather of :data:`~commpress.collectives.executor.EARLY_VERDICT_BYTES` or more, on
:data:`~commpress.collectives.executor.EARLY_VERDICT_MIN_RANKS` ranks or more, instead
puts that all-reduce in flight at its start (:meth:`Check.post_early_verdict`) and writes
its output as soon as the verdict says every rank agrees: the digest covers whether a rank
runs a chain, whether it takes the early verdict, whether it sends its last header alone,
where it cuts a long first message and the size of every message it sends, so agreeing
digests leave no poison to come. A failure after the verdict (a peer that dies or stalls)
can then leave the output partly written, as a failing torch collective does.

Then every rank raises :class:`~commpress.collectives.fingerprint.CollectiveMismatchError`
after the all-reduce and an all-gather of the whole fingerprints, to name both sides;
every message has been received, so the group stays usable.
"""

from __future__ import annotations

import struct
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from commpress.collectives import fingerprint as fingerprints
from commpress.collectives.fingerprint import CollectiveMismatchError, Fingerprint
from commpress.collectives.workspace import workspace
from commpress.schedules.ring import neighbours
from commpress.schedules.wire import HEADER_BYTES, wire_bytes
from commpress.transport import backends, collective, p2p

#: The largest first message; every rank's first receive is posted this large.
FIRST_MESSAGE_BYTES = 8 << 20
_MAGIC = b"cpi2"  # the second layout: a header may say it travelled alone
# magic, poisoned, split, digest, this message's bytes, the sender's next message's bytes
_HEADER = struct.Struct("<4s??2xQQQ")


class Header(NamedTuple):
    digest: int
    poisoned: bool
    total: int  # this message's bytes, header included (the whole, when cut in two)
    next_bytes: int  # the sender's next message to this rank, 0 after its last
    split: bool = False  # the header travels alone, the rest of the message after it


def applies(group: dist.ProcessGroup | None, device) -> bool:
    """Whether a checked collective on ``group`` with tensors on ``device`` carries its
    check in band: CPU tensors, in a group of two or more whose backend is not NCCL alone.
    CUDA tensors keep the all-reduce (NCCL's point-to-point wants matching sizes, and a
    group made without naming a backend moves them with NCCL)."""
    return (
        torch.device(device).type == "cpu"
        and dist.get_world_size(group) > 1
        and p2p.sends_may_go_alone(group)
    )


def call_wire_bytes(
    op: str, algorithm: str, codec, tensor: torch.Tensor, group: dist.ProcessGroup | None
) -> int:
    """The bytes each rank sends in one compressed call on ``group`` whose input is
    ``tensor``, this check's headers included where it rides along (:func:`applies`), as
    the executor runs it (its :data:`~commpress.collectives.executor.WINDOW`)."""
    from commpress.collectives import executor  # which imports this module

    checked = applies(group, tensor.device)
    world_size = dist.get_world_size(group)
    numel, dtype = tensor.numel(), tensor.dtype
    window = executor.WINDOW
    return wire_bytes(
        op, algorithm, codec, numel, world_size, dtype, in_band_check=checked, window=window
    )


def read(message: torch.Tensor) -> Header | None:
    """``None`` when ``message`` (on the CPU) does not start with a header this version
    writes."""
    magic, poisoned, split, digest, total, next_bytes = _HEADER.unpack_from(message.numpy(), 0)
    return Header(digest, poisoned, total, next_bytes, split) if magic == _MAGIC else None


class LeftDisagrees(Exception):
    """Raised inside a run when the left neighbour's first header differs from this rank's."""

    def __init__(self, header: Header | None):
        super().__init__("the left neighbour's arguments differ")
        self.header = header
        self.pending: p2p.Batch | None = None  # this rank's own first message's rest


class Check:
    """One collective's check: this rank's digest, the poison it has seen, and the chain of
    messages it sends to its right neighbour."""

    def __init__(
        self,
        group,
        mine: Fingerprint,
        timeout: timedelta | p2p.Deadline | None,
        device,
        chains: bool,
        early: bool = False,
        sizes: tuple[int, ...] = (),
        split_last: bool = False,
        said: int | None = None,
        point_to_point: bool = False,
    ):
        """``chains``: whether this rank's schedule carries the check in its messages;
        ``early``: whether a chain also takes every rank's verdict from an all-reduce in
        flight (:meth:`post_early_verdict`); ``sizes``: the bytes of every message this
        rank's schedule sends; ``split_last``: whether a chain sends the header of its last
        message alone, ahead of the rest (:meth:`wire`), so that the verdict it completes
        is known while the rest is on the wire; ``point_to_point``: whether a schedule
        that names one of the backend's collectives posts it point to point instead. All
        five, and :data:`FIRST_MESSAGE_BYTES`, are part of the digest: ranks whose digests
        agree exchange messages of the sizes each expects, and in the same way, so no
        poison can follow. ``said``: the digest sent instead, by a step
        that is no collective but must meet one (:func:`~commpress.collectives.auto.resolve`'s
        exchange: its ranks agree on it whatever their calls, and a rank that runs a
        collective in its place disagrees); ``mine`` still names this rank's call."""
        self.group = backends.or_world(group)
        self.timeout, self.device = timeout, device
        self.rank, self.world_size = self.group.rank(), self.group.size()
        self.left, self.right = neighbours(self.rank, self.world_size)
        self.sequence = fingerprints.next_sequence(self.group)  # this call's, on the group
        self.row = mine.to_bytes(self.sequence)
        # FIRST_MESSAGE_BYTES too: where a long first message is cut changes what is sent
        flags = (chains, early, split_last, point_to_point)
        layout = struct.pack(f"<????Q{len(sizes)}Q", *flags, FIRST_MESSAGE_BYTES, *sizes)
        self.digest = fingerprints.digest(self.row + layout) if said is None else said
        self.early, self.split_last = early, split_last and chains  # only a chain splits
        self.poisoned = False
        self._reduced: p2p.Pending | None = None  # the verdict's all-reduce, in flight
        self._verdict: torch.Tensor | None = None
        self._header: p2p.Batch | None = None  # a header alone, in flight
        self._scratch: torch.Tensor | None = None

    def stamp(self, message: torch.Tensor, next_message: torch.Tensor | None) -> None:
        """Write this rank's header in front of ``message`` (packed in place, through a
        view: on this path every Python call shows in a small collective's time). The
        last message (no ``next_message``) says whether it travels split (:meth:`wire`)."""
        following = 0 if next_message is None else next_message.numel()
        split = self.split_last and next_message is None
        total = message.numel()
        _HEADER.pack_into(
            message.numpy(), 0, _MAGIC, self.poisoned, split, self.digest, total, following
        )

    def wire(self, message: torch.Tensor, last: bool) -> list[torch.Tensor]:
        """The messages on the wire that carry ``message``: itself, or, for the last one of
        a chain that splits it, its header alone and then the rest."""
        if last and self.split_last:
            return [message[:HEADER_BYTES], message[HEADER_BYTES:]]
        return [message]

    # -- the first message, both ways --------------------------------------------------

    def send_first(self, message: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The first message cut after :data:`FIRST_MESSAGE_BYTES`: ``(first part, rest)``,
        the rest ``None`` when there is none. The rest goes in a batch of its own, waited
        only after the left neighbour's first part has been read (the right neighbour
        posts its receive once it has read this rank's first part)."""
        cut = FIRST_MESSAGE_BYTES
        return (message, None) if message.numel() <= cut else (message[:cut], message[cut:])

    def first_scratch(self) -> torch.Tensor:
        return workspace.take("inband.first", FIRST_MESSAGE_BYTES, torch.uint8, self.device)

    def accept_first(
        self, scratch: torch.Tensor, into: torch.Tensor | None = None
    ) -> p2p.Batch | None:
        """Read the left neighbour's first header from ``scratch``; raise
        :class:`LeftDisagrees` unless it agrees and its message is the size expected.
        ``into``: where this rank's schedule wants the message (copied there, its rest
        received there directly, unless ``into`` is the start of ``scratch`` itself);
        ``None`` for the header alone of a schedule that is not a chain. Returns the
        receive of the message's rest, posted and not yet waited; ``None`` where there is no
        rest to receive (a header alone, or a message that came whole)."""
        header = read(scratch)
        expected = HEADER_BYTES if into is None else into.numel()
        if header is None or header.digest != self.digest:
            raise LeftDisagrees(header)
        if header.total != expected:  # the digests agree, yet not the sizes: a mismatch anyway
            raise LeftDisagrees(header)
        self.poisoned |= header.poisoned
        if into is None or into.data_ptr() == scratch.data_ptr():
            return None
        first = min(into.numel(), FIRST_MESSAGE_BYTES)
        rest = None
        if into.numel() > first:
            rest = p2p.Batch(self.group, [], [(into[first:], self.left)])
        into[:first].copy_(scratch[:first])
        return rest

    def note(self, message: torch.Tensor) -> None:
        """A later message from the left neighbour (which agrees) has arrived."""
        magic, poisoned, _, _, total, _ = _HEADER.unpack_from(message.numpy(), 0)
        self.poisoned |= magic != _MAGIC or poisoned or total != message.numel()

    # -- a header alone, then a verdict, for schedules that are not a chain -----------

    def post_header(self) -> None:
        """Start the check of a schedule that is not a chain: one header to the right (every
        rank's first message is one) and every rank's verdict, one all-reduce, in flight.
        :meth:`settle` waits for them."""
        self._post_verdict()
        message = workspace.take("inband.header", HEADER_BYTES, torch.uint8, self.device)
        self.stamp(message, None)
        self._scratch = self.first_scratch()
        receives = [(self._scratch, self.left)]
        self._header = p2p.Batch(self.group, [(message, self.right)], receives)

    def settle(self) -> None:
        """Raise on a mismatch anywhere; later calls return at once."""
        header, self._header = self._header, None
        if header is None:
            return
        header.wait(self.timeout)
        try:
            self.accept_first(self._scratch)
        except LeftDisagrees as disagreement:
            self.disagree(disagreement.header, [])
        if not self._every_rank_agrees():
            self.raise_mismatch()

    # -- an early verdict, for chains whose writes to the output are held -------------

    def post_early_verdict(self) -> None:
        """Put every rank's verdict in flight beside the chain (every rank of the group
        whose digest agrees does the same, ``early`` being part of it)."""
        self._post_verdict()

    def agreed_early(self) -> bool:
        """Whether the early verdict has come, without waiting for it, and says that every
        rank agrees: then no poison can arrive, and the output may be written."""
        reduced = self._reduced
        if reduced is None or not reduced.is_completed():
            return False
        return self._every_rank_agrees()

    def finish(self) -> None:
        """The end of an unpoisoned chain: an early verdict is waited for if it is still
        in flight (it cannot disagree when no poison came, but a rank told so raises)."""
        if self._verdict is not None and not self._every_rank_agrees():
            self.raise_mismatch()

    def _post_verdict(self) -> None:
        """One all-reduce (MAX) of ``[digest, -digest]``: every rank agrees when the two are
        each other's negation. Every rank of a mismatch joins it once: those whose schedule
        is not a chain always, the others on their way to :meth:`raise_mismatch` (every one
        of them is poisoned by then, and its digest, which says it runs a chain, differs
        from theirs)."""
        self._verdict = fingerprints.digest_pair(self.digest)
        self._reduced = p2p.Pending(
            collective.all_reduce(self._verdict, dist.ReduceOp.MAX, self.group)
        )

    def _every_rank_agrees(self) -> bool:
        """The verdict (posted now if it was not); once per collective."""
        if self._verdict is None:
            self._post_verdict()
        reduced, self._reduced = self._reduced, None
        if reduced is not None:
            reduced.wait(self.timeout)
        return fingerprints.pair_agrees(self._verdict)

    # -- the ends ------------------------------------------------------------------------

    def disagree(
        self,
        first: Header | None,
        remaining: list[torch.Tensor],
        pending: p2p.Batch | None = None,
    ) -> None:
        """The left neighbour's arguments differ: send the rest of this rank's chain
        (poisoned), receive and drop the rest of the left's, then raise. ``pending``: sends
        of this rank's already posted, waited only after the drain."""
        self.poisoned = True
        parts = []
        for index, message in enumerate(remaining):
            following = remaining[index + 1] if index + 1 < len(remaining) else None
            self.stamp(message, following)
            parts += self.wire(message, following is None)
        sends = p2p.Batch(self.group, [(part, self.right) for part in parts], [])
        readable = first is not None
        if readable:
            rest = max(first.total - FIRST_MESSAGE_BYTES, 0)
            if rest:
                self._drop(rest)
            size = first.next_bytes
            while size:
                header = self._drop(size)
                if header is None:
                    readable = False
                    break
                if header.split:  # what came was its header alone: the rest follows
                    self._drop(header.total - HEADER_BYTES, read_header=False)
                size = header.next_bytes
        if pending is not None:
            pending.wait(self.timeout)
        sends.wait(self.timeout)
        self.raise_mismatch(readable)

    def _drop(self, size: int, read_header: bool = True) -> Header | None:
        buffer = workspace.take("inband.dropped", size, torch.uint8, self.device)
        p2p.Batch(self.group, [], [(buffer, self.left)]).wait(self.timeout)
        return read(buffer) if read_header and size >= HEADER_BYTES else None

    def raise_mismatch(self, drained: bool = True) -> None:
        self._every_rank_agrees()  # the ranks whose schedule is not a chain wait in it
        rows = fingerprints.every_fingerprint(self.group, self.row, self.device, self.timeout)
        if len(set(rows)) == 1:
            message = (
                f"every rank of a group of {self.world_size} called the collective with the "
                "same arguments, but their messages differ (in size, or in how the check "
                "travels): a setting outside the arguments differs between ranks (e.g. "
                "commpress.collectives.executor.WINDOW)"
            )
        else:
            global_ranks = dist.get_process_group_ranks(self.group)
            message = fingerprints.mismatch_message(rows, self.rank, self.world_size, global_ranks)
        if not drained:
            message += "; a peer's messages could not be drained, so this group may be unusable"
        raise CollectiveMismatchError(message) from None  # the disagreement was a signal
