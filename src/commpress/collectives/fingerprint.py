"""Ranks agree on a collective's arguments before any payload moves.

Every compressed collective starts with an :class:`Agreement` on a fixed-size fingerprint
of its arguments (operation, reduction, algorithm, element count, dtype, codec spec,
pipeline piece size, and the call's sequence number on the group). If any
rank's fingerprint differs, every rank raises :class:`CollectiveMismatchError` naming
both sides' arguments, before it sends a payload or writes its output; the process
and the group stay usable, so the next collective with matching arguments works.

How: a fast check, and the full exchange only when it fails. Every rank reduces a 63-bit
digest of its fingerprint with one all-reduce (MAX of ``digest`` and of ``-digest``: the
ranks agree exactly when the two maxima are each other's negation). That is one small
collective per call, in ``log n`` steps on NCCL's trees, with no connection to every peer.
On the emulated cluster (8 hosts, 1 MiB int8 ring all-gather) it costs 6.2 ms per call
where a point-to-point round with every peer cost 10.4 ms; on 4 hosts the two are within
the spread (``benchmarks/fingerprint_cost_cpu-2core_2026-11-25.md``). Only when the
digests differ do the ranks all-gather their whole 128-byte fingerprints, to name both
sides' arguments.

Why fixed-size messages and not a header on each payload: gloo ends the process when a
message's size differs from the receive posted for it, and payload sizes depend on the
very arguments being checked. A point-to-point schedule does not wait for the check
before its first send: it leaves with the check in flight (:meth:`Agreement.sent_early`),
and only the first receives wait for it. Each fingerprint names that early payload
(destination and size), so on a mismatch every rank receives and drops what was sent to
it early, no message stays in flight, and the group stays usable.

The sequence number counts this process's checked collectives per group: a rank
that skipped or added one is named ("rank 1 called ... as its collective #8 on this
group").
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import weakref
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from commpress.transport import collective
from commpress.transport.p2p import Batch, Pending, wait

OPERATIONS = ("all_gather", "reduce_scatter", "all_reduce")
#: Reductions by wire code; code 0 ("") is a collective without one.
REDUCTIONS = ("", "sum", "avg")
_REDUCTION_NAMES = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg"}
FINGERPRINT_BYTES = 128
_MAGIC, _VERSION = b"cpfp", 2
# magic, version, op, reduction, text length, sequence, numel, chunk_bytes, text digest,
# the rank the first payload was sent to before the check (-1: none) and its bytes
_HEAD = struct.Struct("<4sBBBBQQQ8siQ")
_EARLY = slice(struct.calcsize("<4sBBBBQQQ8s"), _HEAD.size)  # differs from rank to rank
_TEXT_BYTES = FINGERPRINT_BYTES - _HEAD.size
_TRUNCATED = "…"
_MAX_U64 = 2**64 - 1

_sequences: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class CollectiveMismatchError(RuntimeError):
    """Ranks called the same collective slot with different arguments."""


class EarlySend(NamedTuple):
    """The one payload a rank sends before the check: to group rank ``to``, ``nbytes`` long.
    Each fingerprint carries it, so that after a mismatch its receiver can take it off the
    wire whatever the sender's arguments were."""

    to: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """The arguments every rank of a collective must agree on."""

    op: str  # one of OPERATIONS
    algorithm: str
    numel: int  # elements of this rank's input
    dtype: str  # torch dtype name without "torch.", e.g. "float32"
    codec: str  # canonical spec, str(codec)
    reduction: str = ""  # "sum", "avg", or "" for all_gather
    chunk_bytes: int = 0  # pipeline piece size where it shapes the messages, else 0

    def __post_init__(self):
        if self.op not in OPERATIONS:
            raise ValueError(f"op must be one of {OPERATIONS}, got {self.op!r}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {self.reduction!r}")

    @classmethod
    def of(
        cls, op: str, tensor: torch.Tensor, codec, algorithm: str, reduce_op=None, chunk_bytes=0
    ) -> Fingerprint:
        """The fingerprint of a call on ``tensor`` (the rank's input); ``reduce_op`` already
        checked (SUM or AVG)."""
        return cls(
            op=op,
            algorithm=algorithm,
            numel=tensor.numel(),
            dtype=str(tensor.dtype).removeprefix("torch."),
            codec=str(codec),
            reduction="" if reduce_op is None else _REDUCTION_NAMES[reduce_op],
            chunk_bytes=chunk_bytes,
        )

    def _text(self) -> str:
        return f"{self.dtype} {self.algorithm} {self.codec}"

    def to_bytes(self, sequence: int, early: EarlySend | None = None) -> bytes:
        text = self._text().encode()
        early_to, early_bytes = (-1, 0) if early is None else early
        head = _HEAD.pack(
            _MAGIC,
            _VERSION,
            OPERATIONS.index(self.op),
            REDUCTIONS.index(self.reduction),
            min(len(text), 255),
            sequence,
            self.numel,
            min(self.chunk_bytes, _MAX_U64),
            hashlib.blake2b(text, digest_size=8).digest(),
            early_to,
            early_bytes,
        )
        return head + text[:_TEXT_BYTES].ljust(_TEXT_BYTES, b"\0")

    def call(self) -> str:
        """'all_gather (ring)', 'reduce_scatter (alltoall, avg)'."""
        reduction = f", {self.reduction}" if self.reduction else ""
        return f"{self.op} ({self.algorithm}{reduction})"

    def describe(self) -> str:
        return f"{self.call()} with {self.numel} {self.dtype} elements, codec {self.codec}"


@dataclasses.dataclass(frozen=True)
class _Received:
    """A fingerprint as read back from the wire (its text may be truncated)."""

    fingerprint: Fingerprint
    sequence: int
    digest: bytes
    early: EarlySend | None  # what the sender sent before the check


def _parse(row: bytes) -> _Received | None:
    """``None`` for bytes that are not a fingerprint this version can read."""
    magic, version, op, reduction, length, sequence, numel, chunk, digest, to, size = _HEAD.unpack(
        row[: _HEAD.size]
    )
    if magic != _MAGIC or version != _VERSION or op >= len(OPERATIONS):
        return None
    if reduction >= len(REDUCTIONS):
        return None
    text = row[_HEAD.size :].rstrip(b"\0").decode(errors="replace")
    if length > _TEXT_BYTES:
        text += _TRUNCATED
    dtype, algorithm, codec = (text.split(" ", 2) + ["?", "?"])[:3]
    fingerprint = Fingerprint(
        OPERATIONS[op], algorithm, numel, dtype, codec, REDUCTIONS[reduction], chunk
    )
    return _Received(fingerprint, sequence, digest, None if to < 0 else EarlySend(to, size))


class Agreement:
    """A fingerprint exchange in flight: :meth:`check` waits for it and raises on mismatch.

    Started before a collective encodes its first payload and checked just before the
    first send or write to the output, so the exchange overlaps the encoding.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        mine: Fingerprint,
        timeout: timedelta | None,
        device: torch.device,
        early: EarlySend | None = None,
    ):
        """``early``: the payload the caller will send before :meth:`check` (announced in
        this rank's fingerprint), posted with :meth:`sent_early`."""
        group = dist.group.WORLD if group is None else group
        self._group, self._timeout = group, timeout
        self._world_size = dist.get_world_size(group)
        sequence = _sequences.get(group, 0)
        _sequences[group] = sequence + 1
        self._batch: Pending | None = None
        self._early: Batch | None = None
        if self._world_size == 1:
            return
        self._row = mine.to_bytes(sequence, early)
        self._device = _fingerprint_device(group, device)
        self._digests = _digests(self._row).to(self._device)
        self._batch = Pending(collective.all_reduce(self._digests, dist.ReduceOp.MAX, group))

    def check(self) -> None:
        """Block until every rank's fingerprint is here; raise if any differs from ours.
        Later calls return at once."""
        batch, self._batch = self._batch, None
        if batch is None:
            return
        batch.wait(self._timeout)
        largest, negated_smallest = self._digests.tolist()
        if largest == -negated_smallest:
            return
        rows = self._every_fingerprint()
        rank = dist.get_rank(self._group)
        message = _mismatch_message(rows, rank, self._world_size)
        if not self._drain(rows, rank):
            message += "; a peer's messages could not be drained, so this group may be unusable"
        raise CollectiveMismatchError(message)

    def _every_fingerprint(self) -> list[bytes]:
        """Every rank's whole fingerprint, after the digests have differed (every rank
        takes this path, since every rank holds the same maxima). A collective, not
        point-to-point messages: an early payload may be ahead of them between two ranks,
        and gloo ends the process whose receive it does not fit."""
        local = torch.frombuffer(bytearray(self._row), dtype=torch.uint8).to(self._device)
        gathered = torch.empty(
            self._world_size * FINGERPRINT_BYTES, dtype=torch.uint8, device=self._device
        )
        wait(collective.all_gather(gathered, local, self._group), self._timeout)
        return [bytes(row) for row in gathered.view(self._world_size, -1).cpu().numpy()]

    def sent_early(self, sends: Batch) -> None:
        """``sends``: the payload announced as ``early``, on its way before :meth:`check`."""
        self._early = sends

    def _drain(self, rows: list[bytes], rank: int) -> bool:
        """Receive and drop the payload each peer's fingerprint says it sent this rank before
        the check; then let this rank's own early send finish. False when a peer's
        fingerprint cannot be read (another version, or not a commpress collective)."""
        device = self._device  # NCCL moves CUDA tensors only
        drains, readable = [], True
        for peer, row in enumerate(rows):
            received = None if peer == rank else _parse(row)
            if peer != rank and received is None:
                readable = False
            elif received is not None and received.early and received.early.to == rank:
                payload = torch.empty(received.early.nbytes, dtype=torch.uint8, device=device)
                drains.append((payload, peer))
        try:
            Batch(self._group, [], drains).wait(self._timeout)
        finally:
            if self._early is not None:  # its buffer is the workspace's: let it leave first
                self._early.wait(self._timeout)
        return readable


def _digests(row: bytes) -> torch.Tensor:
    """``[d, -d]`` for the 63-bit digest ``d`` of what every rank's fingerprint must share:
    after an all-reduce with MAX, the ranks agree exactly when the two are negations."""
    digest = hashlib.blake2b(_arguments(row), digest_size=8).digest()
    value = int.from_bytes(digest, "little") >> 1
    return torch.tensor([value, -value], dtype=torch.int64)


def agree(
    group: dist.ProcessGroup | None,
    mine: Fingerprint,
    timeout: timedelta | None,
    device: torch.device,
) -> None:
    """Exchange fingerprints with every rank of ``group``; raise on any difference.

    Call it on the communication thread, before the collective touches its output or
    sends a payload; ``device`` is where the collective's tensors live. Raises
    :class:`CollectiveMismatchError` on every rank of a mismatch; a peer that stalls
    past ``timeout`` raises as any collective does.
    """
    Agreement(group, mine, timeout, device).check()


def _fingerprint_device(group: dist.ProcessGroup, device: torch.device) -> torch.device:
    """NCCL moves only CUDA tensors; every other backend takes the fingerprint on the CPU."""
    return device if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _arguments(row: bytes) -> bytes:
    """What every rank's fingerprint must share: all but the early send's destination."""
    return row[: _EARLY.start] + row[_EARLY.stop :]


def _mismatch_message(rows: list[bytes], rank: int, world_size: int) -> str:
    own = _parse(rows[rank])
    assert own is not None, "this rank's own fingerprint must parse"
    parts = []
    groups: dict[bytes, list[int]] = {}
    for other, row in enumerate(rows):
        if _arguments(row) != _arguments(rows[rank]):
            groups.setdefault(_arguments(row), []).append(other)
    for ranks in groups.values():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        theirs = _parse(rows[ranks[0]])
        if theirs is None:
            parts.append(
                f"{who} sent a fingerprint this rank cannot read (another commpress version, "
                "or a torch.distributed collective on the same group)"
            )
        else:
            parts.append(_difference(who, theirs, own))
    return (
        f"ranks of a group of {world_size} called a collective with different arguments "
        f"(this is rank {rank}): " + "; ".join(parts)
    )


def _difference(who: str, theirs: _Received, own: _Received) -> str:
    """'rank 1 called all_gather (ring) with 1200 float32 elements, codec int4; this rank:
    1000 elements, codec int8'."""
    a, b = theirs.fingerprint, own.fingerprint
    mine = []
    if a.op != b.op or a.algorithm != b.algorithm or a.reduction != b.reduction:
        mine.append(b.call())
    if a.numel != b.numel:
        mine.append(f"{b.numel} elements")
    if a.dtype != b.dtype:
        mine.append(b.dtype)
    if a.codec != b.codec or (theirs.digest != own.digest and not mine):
        mine.append(f"codec {b.codec}")
    said = f"{who} called {a.describe()}"
    if a.chunk_bytes != b.chunk_bytes:
        said += f", chunk_bytes={a.chunk_bytes}"
        mine.append(f"chunk_bytes={b.chunk_bytes}")
    if theirs.sequence != own.sequence:
        said += f" as its collective #{theirs.sequence} on this group"
        mine.append(f"collective #{own.sequence} (a rank skipped or added a commpress collective)")
    return f"{said}; this rank: {', '.join(mine)}"
