"""Process groups commpress makes for one object of its own (a low-rank DDP hook's
reducer, whose worker thread must not share its group with another hook's), destroyed
once that object is gone. (The groups of ``cp.fsdp.compress`` and ``cp.ddp.hook`` are
shared by every model instead: :mod:`commpress.integrations.groups`.)

torch keeps every group until ``destroy_process_group``: each one a hook made held its
connections and the backend's threads for as long as the process ran, however many
models came and went (``commpress train``'s runs, a sweep in one process). A group's
owner, once garbage-collected, leaves it to be destroyed by the next :func:`new_group` on
this rank: never from the collector itself, which may run on any thread in the middle of
anything.
"""

from __future__ import annotations

import weakref

import torch.distributed as dist

from commpress.transport.backends import registered

#: Groups whose owners were garbage-collected, not destroyed yet.
_released: list[dist.ProcessGroup] = []


def new_group(**kwargs) -> dist.ProcessGroup:
    """``dist.new_group(**kwargs)`` (a collective call: every rank), after destroying the
    groups released so far on this rank."""
    destroy_released()
    return dist.new_group(**kwargs)


def release_with(owner: object, *groups: dist.ProcessGroup) -> None:
    """Release ``groups`` once ``owner`` is garbage-collected."""
    weakref.finalize(owner, _released.extend, groups).atexit = False


def destroy_released() -> None:
    """Destroy the groups released so far (those torch still has)."""
    while _released:
        group = _released.pop()
        if registered(group):
            dist.destroy_process_group(group)
