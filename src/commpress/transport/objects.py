"""Small Python objects exchanged by every rank of a group, within a timeout.

``torch.distributed.all_gather_object`` waits for the process group's timeout (30 minutes
by default) when a peer never joins; a collective's own set-up (the tuner's agreement on
its choice, a multicast channel's addresses) must give up within that collective's
``timeout``, as the collective itself does."""

from __future__ import annotations

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.transport import backends, collective
from commpress.transport.p2p import wait


def all_gather_objects(
    obj: object, group: dist.ProcessGroup | None, timeout: timedelta | None
) -> list:
    """Every rank's ``obj`` (picklable), in rank order: a collective, which every rank of
    ``group`` must call. A peer that does not join within ``timeout`` (None: the group's)
    makes the backend's timeout error rise here."""
    device = _device(group)
    data = pickle.dumps(obj)
    world_size = dist.get_world_size(group)
    sizes = torch.empty(world_size, dtype=torch.int64, device=device)
    own_size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    wait(collective.all_gather(sizes, own_size, group), timeout)
    sizes = sizes.tolist()
    longest = max(sizes)
    own = torch.zeros(longest, dtype=torch.uint8)
    own[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    rows = torch.empty(world_size * longest, dtype=torch.uint8, device=device)
    wait(collective.all_gather(rows, own.to(device), group), timeout)
    rows = rows.view(world_size, longest).cpu()
    return [pickle.loads(rows[rank, :size].numpy().tobytes()) for rank, size in enumerate(sizes)]


def _device(group: dist.ProcessGroup | None) -> torch.device:
    """Where ``group`` moves tensors: the CPU where it can (gloo), else this process's
    current accelerator (NCCL: the GPU ``torch.cuda.set_device`` chose), as torch's own
    object collectives choose."""
    if backends.moves(group, "cpu"):
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None:
        raise RuntimeError(
            f"{backends.name(group)} moves no CPU tensors, and no accelerator is here"
        )
    return torch.device(accelerator.type, torch.accelerator.current_device_index())
