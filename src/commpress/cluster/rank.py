"""One rank's body, whichever launcher started the process: join the group, run, leave."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def run_rank(
    fn: Callable[..., Any],
    args: tuple,
    rank: int,
    world_size: int,
    *,
    backend: str,
    init_method: str,
    timeout: float,
    leave: Callable[[bytes], None] | None = None,
) -> bytes:
    """``fn(rank, world_size, *args)`` inside a process group of its own; its value as the
    bytes of ``torch.save`` (plain bytes: a queue of torch's would share tensors through
    memory this process frees when it ends).

    ``leave``, given, is called with those bytes while the group is still up: a launcher
    that holds each rank there until every rank has reported keeps a rank that finished
    first from closing connections a slower peer is still opening (a ``dist.new_group``
    in ``fn``, whose connectFullMesh then fails with "Connection closed by peer").
    """
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )
    try:
        # every rank's connections are up before any may end: a rank that dies at once
        # (a test's os._exit) otherwise fails a slower peer's connectFullMesh first
        dist.barrier()
        value = fn(rank, world_size, *args)
        serialized = io.BytesIO()
        torch.save(value, serialized)
        value_bytes = serialized.getvalue()
        if leave is not None:
            leave(value_bytes)
    finally:
        if dist.is_initialized():  # fn may have ended it, as a torch script ends
            dist.destroy_process_group()
    return value_bytes
