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
) -> bytes:
    """``fn(rank, world_size, *args)`` inside a process group of its own; its value as the
    bytes of ``torch.save`` (plain bytes: a queue of torch's would share tensors through
    memory this process frees when it ends)."""
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )
    try:
        # every rank's connections are up before any may finish and close its own: a rank
        # whose fn returns at once (a refused argument) otherwise ends a slower peer's
        # connectFullMesh with "Connection closed by peer"
        dist.barrier()
        value = fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    serialized = io.BytesIO()
    torch.save(value, serialized)
    return serialized.getvalue()
