"""Small Python objects exchanged by every rank of a group, within a timeout.

``torch.distributed.all_gather_object`` waits for the process group's timeout (30 minutes
by default) when a peer never joins; a collective's own set-up (the tuner's agreement on
its choice, a multicast channel's addresses) must give up within that collective's
``timeout``, as the collective itself does. :func:`ring_gather_objects` passes them by
point-to-point messages of a tag of their own instead, never matched with a peer's
collective (the integrations' set-up exchange)."""

from __future__ import annotations

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.transport import backends, collective, p2p
from commpress.transport.p2p import wait

#: The tag of :func:`ring_gather_objects`' messages where a caller names none of its own:
#: neither the compressed collectives' (:data:`~commpress.transport.p2p.COLLECTIVES_TAG`)
#: nor 0, torch's default.
SET_UP_TAG = 0x636F6D70  # "comp"


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


def ring_gather_objects(
    obj: object, group: dist.ProcessGroup | None, timeout: timedelta | None, tag: int = SET_UP_TAG
) -> list:
    """Every rank's ``obj`` (picklable), in rank order, as :func:`all_gather_objects`
    gives it, but passed around the ring of ``group`` by point-to-point messages of ``tag``:
    in each of ``size - 1`` steps every rank sends its right neighbour an 8-byte length and
    then that many pickled bytes, and receives the same from its left, into a buffer of
    exactly the length announced. Every rank of ``group`` must call it; a peer that does
    not send within ``timeout``, counted from the call for all its steps together (None:
    the group's, for each message), makes the backend's timeout error rise here.

    gloo matches point-to-point messages by tag, and never with a collective: against a
    peer that runs a collective on ``group`` instead (its own all-gather, FSDP2's), this
    times out, where :func:`all_gather_objects` would meet that collective and gloo end the
    process on the size mismatch. For groups whose sends of CPU tensors may go alone
    (:func:`~commpress.transport.p2p.sends_may_go_alone`: not NCCL); ValueError for others.
    """
    group_ = backends.or_world(group)
    if not p2p.sends_may_go_alone(group_):
        raise ValueError(
            f"group: {backends.name(group_)} moves no CPU tensors by sends of their own; "
            "use all_gather_objects"
        )
    size, rank = dist.get_world_size(group_), dist.get_rank(group_)
    pickled: list[bytes | None] = [None] * size
    pickled[rank] = pickle.dumps(obj)
    right, left = (rank + 1) % size, (rank - 1) % size
    deadline = p2p.Deadline.of(timeout)
    for step in range(size - 1):
        outgoing = pickled[(rank - step) % size]
        length = torch.empty(1, dtype=torch.int64)
        sent_length = torch.tensor([len(outgoing)], dtype=torch.int64)
        _wait_all(p2p.post_each(group_, [(sent_length, right)], [(length, left)], tag), deadline)
        received = torch.empty(int(length.item()), dtype=torch.uint8)
        sent = torch.frombuffer(bytearray(outgoing), dtype=torch.uint8)
        _wait_all(p2p.post_each(group_, [(sent, right)], [(received, left)], tag), deadline)
        pickled[(rank - step - 1) % size] = received.numpy().tobytes()
    return [pickle.loads(data) for data in pickled]


def _wait_all(works: list, deadline: p2p.Deadline | None) -> None:
    for work in works:
        wait(work, deadline)


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
