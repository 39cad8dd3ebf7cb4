"""Paired send/receive of uint8 payloads between ranks of a process group."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


class Exchange:
    """One send to ``right`` and one receive from ``left`` in flight, as group ranks."""

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        send: torch.Tensor,
        right: int,
        recv: torch.Tensor,
        left: int,
    ):
        ops = [
            dist.P2POp(dist.isend, send, dist.get_global_rank(_group(group), right), group),
            dist.P2POp(dist.irecv, recv, dist.get_global_rank(_group(group), left), group),
        ]
        self._works = dist.batch_isend_irecv(ops)

    def wait(self, timeout: timedelta | None = None) -> None:
        """Block until both are done; a peer that stalls past ``timeout`` (default: the
        process group's) or dies raises RuntimeError here."""
        for work in self._works:
            wait(work, timeout)


def wait(work, timeout: timedelta | None) -> None:
    """``work.wait`` with an optional timeout, for any torch.distributed Work."""
    if timeout is None:
        work.wait()
    else:
        work.wait(timeout)


def _group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    return dist.group.WORLD if group is None else group
