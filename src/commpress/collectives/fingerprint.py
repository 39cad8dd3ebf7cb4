"""What every rank of a collective must agree on, and the check of it on NCCL.

A :class:`Fingerprint` is a fixed-size record of a call's arguments (operation,
reduction, algorithm, element count, dtype, codec spec, pipeline piece size, and the
call's sequence number on the group). If any rank's differs, every rank raises
:class:`CollectiveMismatchError` naming both sides' arguments, before it writes its
output; the process and the group stay usable, so the next collective with matching
arguments works.

Two carriers, chosen by the group's backend and the tensors' device:

* CPU tensors on any backend but NCCL (gloo): :mod:`commpress.collectives.inband`. A ring
  carries the check in its own messages, because gloo ends a process whose receive is
  smaller than the message that arrives, and because a check of its own costs a visible
  share of a 1 MiB collective on a busy host (``benchmarks/check_overlap_2026-11-25``);
  other schedules send one header alone, then take an all-reduce's verdict;
* CUDA tensors, or an NCCL group: an :class:`Agreement`, one all-reduce of a 63-bit digest
  of the fingerprint (MAX of ``digest`` and of ``-digest``: the ranks agree exactly when
  the two maxima are each other's negation), overlapped with the encode and awaited
  before the first transfer.

Either way, only on a mismatch do the ranks all-gather their whole 128-byte fingerprints,
to name both sides' arguments.

The sequence number counts this process's checked collectives per group (and its
multicast ones, whose operation ids it gives): a rank that skipped or added one is named
("rank 1 called ... as its collective #8 on this group").
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.ranks import name_ranks, this_rank
from commpress.seeds import digest
from commpress.transport import backends, collective
from commpress.transport.p2p import Deadline, Pending, wait
from commpress.units import counted

OPERATIONS = ("all_gather", "reduce_scatter", "all_reduce")
#: Reductions by wire code; code 0 ("") is a collective without one.
REDUCTIONS = ("", "sum", "avg")
_REDUCTION_NAMES = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg"}
FINGERPRINT_BYTES = 128
_MAGIC, _VERSION = b"cpfp", 3
# magic, version, op, reduction, text length, sequence, numel, chunk_bytes, text digest
_HEAD = struct.Struct("<4sBBBBQQQ8s")
_TEXT_BYTES = FINGERPRINT_BYTES - _HEAD.size
_TRUNCATED = "…"
_MAX_U64 = 2**64 - 1

_sequences: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class CollectiveMismatchError(RuntimeError):
    """Ranks called the same collective slot with different arguments."""


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

    def to_bytes(self, sequence: int) -> bytes:
        text = self._text().encode()
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
        )
        return head + text[:_TEXT_BYTES].ljust(_TEXT_BYTES, b"\0")

    def call(self) -> str:
        """'all_gather (ring)', 'reduce_scatter (alltoall, avg)'."""
        reduction = f", {self.reduction}" if self.reduction else ""
        return f"{self.op} ({self.algorithm}{reduction})"

    def describe(self) -> str:
        elements = counted(self.numel, f"{self.dtype} element")
        return f"{self.call()} with {elements}, codec {self.codec}"


@dataclasses.dataclass(frozen=True)
class _Received:
    """A fingerprint as read back from the wire (its text may be truncated)."""

    fingerprint: Fingerprint
    sequence: int
    digest: bytes


def _parse(row: bytes) -> _Received | None:
    """``None`` for bytes that are not a fingerprint this version can read."""
    magic, version, op, reduction, length, sequence, numel, chunk, digest = _HEAD.unpack(
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
    return _Received(fingerprint, sequence, digest)


class Agreement:
    """A fingerprint exchange in flight, as one all-reduce (NCCL): :meth:`check` waits for it
    and raises on mismatch. Started before a collective encodes its first payload and
    checked before its first transfer, so the exchange overlaps the encoding."""

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        mine: Fingerprint,
        timeout: timedelta | Deadline | None,
        device: torch.device,
        said: int | None = None,
    ):
        """``said``: the digest sent instead of ``mine``'s, as
        :class:`~commpress.collectives.inband.Check` takes it."""
        group = backends.or_world(group)
        self._group, self._timeout = group, timeout
        self._world_size = dist.get_world_size(group)
        self.sequence = next_sequence(group)  # this call's, on the group
        self._batch: Pending | None = None
        if self._world_size == 1:
            return
        self._row = mine.to_bytes(self.sequence)
        self._device = fingerprint_device(group, device)
        if said is None:
            self._digests = _digests(self._row, self._device)
        else:
            self._digests = digest_pair(said, self._device)
        self._batch = Pending(collective.all_reduce(self._digests, dist.ReduceOp.MAX, group))

    def check(self) -> None:
        """Block until every rank's fingerprint is here; raise if any differs from ours.
        Later calls return at once."""
        batch, self._batch = self._batch, None
        if batch is None:
            return
        batch.wait(self._timeout)
        if pair_agrees(self._digests):
            return
        rows = every_fingerprint(self._group, self._row, self._device, self._timeout)
        rank = dist.get_rank(self._group)
        global_ranks = dist.get_process_group_ranks(self._group)
        raise CollectiveMismatchError(mismatch_message(rows, rank, self._world_size, global_ranks))


def next_sequence(group: dist.ProcessGroup) -> int:
    """This process's count of checked collectives on ``group`` so far, then one more."""
    sequence = _sequences.get(group, 0)
    _sequences[group] = sequence + 1
    return sequence


def digest_pair(value: int, device: torch.device | None = None) -> torch.Tensor:
    """``[d, -d]`` for a digest ``d``: after an all-reduce with MAX it holds
    ``[max d, -min d]``, so the ranks agree exactly when :func:`pair_agrees`. Filled where
    it is made: on a GPU, a copy from the host would wait for the stream's queue."""
    pair = torch.full((2,), value, dtype=torch.int64, device=device)
    pair[1:].neg_()
    return pair


def pair_agrees(reduced: torch.Tensor) -> bool:
    """Whether a MAX-reduced :func:`digest_pair` says every rank had the same digest."""
    largest, negated_smallest = reduced.tolist()
    return largest == -negated_smallest


def every_fingerprint(group, row: bytes, device, timeout) -> list[bytes]:
    """Every rank's whole fingerprint (a collective: every rank of ``group`` must call it),
    once the ranks know that they disagree. A collective, not point-to-point messages: a
    payload may be ahead of them between two ranks, and gloo ends the process whose
    receive it does not fit."""
    world_size = dist.get_world_size(group)
    local = torch.frombuffer(bytearray(row), dtype=torch.uint8).to(device)
    gathered = torch.empty(world_size * FINGERPRINT_BYTES, dtype=torch.uint8, device=device)
    wait(collective.all_gather(gathered, local, group), timeout)
    return [bytes(r) for r in gathered.view(world_size, -1).cpu().numpy()]


def _digests(row: bytes, device: torch.device | None = None) -> torch.Tensor:
    """The :func:`digest_pair` of fingerprint ``row``."""
    return digest_pair(digest(row), device)


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


def fingerprint_device(group: dist.ProcessGroup, device: torch.device) -> torch.device:
    """On the CPU where the group moves CPU tensors; else (NCCL alone) on the device."""
    return torch.device("cpu") if backends.moves(group, "cpu") else device


def mismatch_message(
    rows: list[bytes], rank: int, world_size: int, global_ranks: list[int] | None = None
) -> str:
    """Every rank whose ``rows`` differ from this ``rank``'s, named by its rank in the group
    and, where ``global_ranks`` (the group's ranks in the world) say otherwise, in the
    world too (the rank a process is launched as)."""
    own = _parse(rows[rank])
    assert own is not None, "this rank's own fingerprint must parse"
    parts = []
    groups: dict[bytes, list[int]] = {}
    for other, row in enumerate(rows):
        if row != rows[rank]:
            groups.setdefault(row, []).append(other)
    for ranks in groups.values():
        who = name_ranks(ranks, global_ranks)
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
        f"(this is {this_rank(rank, global_ranks)}): " + "; ".join(parts)
    )


def _difference(who: str, theirs: _Received, own: _Received) -> str:
    """'rank 1 called all_gather (ring) with 1200 float32 elements, codec int4; this rank:
    1000 elements, codec int8'."""
    a, b = theirs.fingerprint, own.fingerprint
    mine = []
    if a.op != b.op or a.algorithm != b.algorithm or a.reduction != b.reduction:
        mine.append(b.call())
    if a.numel != b.numel:
        mine.append(counted(b.numel, "element"))
    if a.dtype != b.dtype:
        mine.append(b.dtype)
    if a.codec != b.codec or (theirs.digest != own.digest and not mine):
        mine.append(f"codec {b.codec}")
    said = f"{who} called {a.describe()}"
    if a.chunk_bytes != b.chunk_bytes and (a.op, a.algorithm) == (b.op, b.algorithm):
        said += f", chunk_bytes={a.chunk_bytes}"
        mine.append(f"chunk_bytes={b.chunk_bytes}")
    if theirs.sequence != own.sequence:
        said += f" as its collective #{theirs.sequence} on this group"
        mine.append(f"collective #{own.sequence} (a rank skipped or added a commpress collective)")
    return f"{said}; this rank: {', '.join(mine)}"
