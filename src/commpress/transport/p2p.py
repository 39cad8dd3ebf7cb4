"""Point-to-point sends and receives of uint8 payloads between ranks of a process group."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.transport import backends, owned_groups

#: The tag of the compressed collectives' own point-to-point messages: not 0, the tag of
#: ``torch.distributed.send``/``recv`` by default, so that a user's own messages on the same
#: group never meet them (gloo matches a receive with its peer's first message of the same
#: tag; NCCL has no tags and matches by order alone).
COLLECTIVES_TAG = 0x63707273  # "cprs"
#: A wait past its deadline still looks once (gloo takes 0 for no timeout at all).
_LEAST_WAIT_SECONDS = 0.001


class Deadline:
    """One timeout for several waits together: each is given what is left of it (at least
    a millisecond, so that a wait past the deadline still sees what has arrived). Pass
    one wherever a wait takes a ``timeout``."""

    def __init__(self, timeout: timedelta):
        self.timeout = timeout
        self._at = time.monotonic() + timeout.total_seconds()

    @classmethod
    def of(cls, timeout: timedelta | Deadline | None) -> Deadline | None:
        """``timeout`` from now on; None (each wait the group's own) stays None, and a
        Deadline already running (one shared by several steps of a call) stays itself."""
        if timeout is None or isinstance(timeout, Deadline):
            return timeout
        return cls(timeout)

    def left(self) -> timedelta:
        return timedelta(seconds=max(self._at - time.monotonic(), _LEAST_WAIT_SECONDS))


class Batch:
    """Sends and receives posted together; peers are group ranks. CPU tensors on a group
    whose backend is not NCCL alone are posted each straight on the process group (which
    hands them to gloo), cheaper than ``batch_isend_irecv``
    (``benchmarks/p2p_post_2026-11-26/README.md``); anything else goes through
    ``batch_isend_irecv``, which NCCL needs (one group, or a large message deadlocks) and
    which a group that names no backend, or several, may hand CUDA tensors to NCCL with.

    CUDA tensors on a group that moves only host memory (gloo's sends and receives read
    and write them through their address, and a device address aborts the process:
    ``benchmarks/gpu_2026-11-27/README.md``) are staged through pinned host memory: a
    send is copied out before it is posted, a receive copied in on the caller's current
    stream once :meth:`wait` has seen it arrive.

    Every message is of :data:`COLLECTIVES_TAG`."""

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        sends: Sequence[tuple[torch.Tensor, int]],
        receives: Sequence[tuple[torch.Tensor, int]],
    ):
        group_ = _group(group)
        self._copied_in: list[tuple[torch.Tensor, torch.Tensor]] = []  # (device, host)
        if not sends and not receives:
            self._works = []
            return
        on_cpu = all(t.is_cpu for t, _ in (*sends, *receives))
        if must_stage(group_, on_cpu):
            sends = [(_host_copy(t), peer) for t, peer in sends]
            hosts = [_host_buffer(t) for t, _ in receives]
            self._copied_in = [(t, host) for (t, _), host in zip(receives, hosts, strict=True)]
            receives = [(host, peer) for host, (_, peer) in zip(hosts, receives, strict=True)]
            on_cpu = True
        if on_cpu and sends_may_go_alone(group_):
            self._works = post_each(group_, sends, receives, COLLECTIVES_TAG)
            return
        sent = [_op(dist.isend, t, group_, p) for t, p in sends]
        received = [_op(dist.irecv, t, group_, p) for t, p in receives]
        ops = [op for pair in itertools.zip_longest(sent, received) for op in pair if op]
        self._works = dist.batch_isend_irecv(ops)

    def wait(self, timeout: timedelta | Deadline | None = None) -> None:
        """Block until all are done; a peer that stalls past ``timeout`` (default: the
        process group's; a :class:`Deadline`, all of them together) or dies raises
        RuntimeError here."""
        for work in self._works:
            wait(work, timeout)
        for device, host in self._copied_in:
            device.copy_(host, non_blocking=True)  # ordered on the current stream
        self._copied_in = []


def _op(post, tensor: torch.Tensor, group: dist.ProcessGroup, peer: int) -> dist.P2POp:
    return dist.P2POp(post, tensor, dist.get_global_rank(group, peer), group, COLLECTIVES_TAG)


def must_stage(group: dist.ProcessGroup, on_cpu: bool) -> bool:
    """Whether a batch goes through host memory: some of its tensors are on a GPU
    (``on_cpu`` False) and the group's backend moves host memory only (a group that names
    NCCL moves CUDA tensors itself, whatever name it was made with: :mod:`~.backends`)."""
    return not on_cpu and "nccl" not in backends.name(group)


def _host_buffer(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of ``tensor``, complete on return (the copy waits for the work queued
    before it on the current stream, the encode that wrote ``tensor``)."""
    return _host_buffer(tensor).copy_(tensor)


def sends_may_go_alone(group: dist.ProcessGroup | None) -> bool:
    """Whether a send of CPU tensors may be posted in a batch of its own, its ring partner's
    receive in a later one: where a backend other than NCCL moves them (on NCCL both must be
    in one group or a large message deadlocks)."""
    return backends.moves(_group(group), "cpu") not in (None, "nccl")


def post_each(
    group: dist.ProcessGroup,
    sends: Sequence[tuple[torch.Tensor, int]],
    receives: Sequence[tuple[torch.Tensor, int]],
    tag: int,
) -> list:
    """Post every receive, then every send, each on its own, of ``tag``; the works in that
    order. Receives first: gloo's sender waits for the receive to be posted
    (``benchmarks/check_overlap_2026-11-25/README.md``). ``commpress.testing.silence``
    replaces this function to forbid communication."""
    works = [group.recv([tensor], peer, tag) for tensor, peer in receives]
    return works + [group.send([tensor], peer, tag) for tensor, peer in sends]


def exchange(
    group: dist.ProcessGroup | None, send: torch.Tensor, right: int, recv: torch.Tensor, left: int
) -> Batch:
    """One send to ``right`` and one receive from ``left`` in flight."""
    return Batch(group, [(send, right)], [(recv, left)])


class Pending:
    """Any torch.distributed ``Work`` in flight, waited on as a :class:`Batch` is."""

    def __init__(self, work):
        self._work = work

    def wait(self, timeout: timedelta | Deadline | None = None) -> None:
        wait(self._work, timeout)

    def is_completed(self) -> bool:
        """Whether it has finished (a gloo collective says so without a ``wait``; a gloo
        point-to-point receive does not, until waited)."""
        return self._work.is_completed()


def wait(work, timeout: timedelta | Deadline | None) -> None:
    """``work.wait`` with an optional timeout (a :class:`Deadline`: what is left of it),
    for any torch.distributed Work; one of torch's collectives on a group of commpress's
    own is then no longer tracked (:func:`~commpress.transport.owned_groups.waited`)."""
    if isinstance(timeout, Deadline):
        timeout = timeout.left()
    if timeout is None:
        work.wait()
    else:
        work.wait(timeout)
    owned_groups.waited(work)


def _group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    return dist.group.WORLD if group is None else group
