"""Which backend of a process group moves the tensors of which device.

``dist.get_backend`` gives the name a group was made with, not what moves its tensors: a
group made without naming a backend (``init_process_group()``, which ``init_device_mesh``
calls where nothing is initialised, and every group made after it) is ``"undefined"``,
whatever torch chose for it: NCCL alone where a GPU is visible (nothing moves CPU tensors
there), gloo where not. ``dist.get_backend_config`` says which (``"cuda:nccl"``,
``"cpu:gloo,cuda:gloo"``)."""

from __future__ import annotations

import functools
import os
import weakref

import torch.distributed as dist

from commpress._torch_private import process_groups


def moves(group: dist.ProcessGroup | None, device_type: str) -> str | None:
    """The backend that moves ``group``'s tensors of ``device_type`` ("gloo", "nccl"), or
    None where none does."""
    return _by_device(dist.get_backend_config(group)).get(device_type)


def only_gloo(group: dist.ProcessGroup) -> bool:
    """Whether gloo moves every tensor ``group`` moves (no NCCL beside it)."""
    return set(_by_device(dist.get_backend_config(group)).values()) == {"gloo"}


@functools.lru_cache(maxsize=64)  # read on every compressed call, and several times in one
def _by_device(config: str) -> dict[str, str]:
    """``{"cpu": "gloo", "cuda": "nccl"}`` of ``"cpu:gloo,cuda:nccl"`` (never modified)."""
    return dict(pair.split(":", 1) for pair in config.split(","))


def name(group: dist.ProcessGroup | None) -> str:
    """``dist.get_backend(group)``, or, for a group made without naming a backend, its
    device:backend pairs ("cuda:nccl" where a GPU is visible, "cpu:gloo" where not)."""
    backend = dist.get_backend(group)
    return dist.get_backend_config(group) if backend == dist.Backend.UNDEFINED else backend


def or_world(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``group``, or for None the default group; torch's own ValueError where
    ``init_process_group`` has not run (or the group was destroyed): state kept per group
    by weak reference cannot be keyed by the None torch then has."""
    if group is not None:
        return group
    world = dist.group.WORLD
    if world is None:
        raise ValueError(
            "Default process group has not been initialized, please make sure to call "
            "init_process_group."
        )
    return world


def registered(group: dist.ProcessGroup) -> bool:
    """Whether ``group`` is still one of torch's process groups: not destroyed, nor one of
    a world destroyed since."""
    if not dist.is_initialized():
        return False
    try:
        dist.get_process_group_ranks(group)
    except (KeyError, ValueError):
        return False
    return True


#: In a forked child, each process group it inherited, with the process that had it when
#: it forked (the first such, for a group inherited through several forks).
_inherited: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _after_fork_in_child() -> None:
    """Remember the groups the parent had: their connections are the parent's, and the
    backend's threads that move their data (gloo's event loop, its workers) did not survive
    the fork. Never raises (a fork handler's error is printed and lost): without torch's
    list of groups, none is remembered."""
    try:
        groups = process_groups() if dist.is_available() and dist.is_initialized() else []
    except Exception:  # noqa: BLE001 - a torch without the private list: check nothing
        return
    parent = os.getppid()
    for group in groups:
        _inherited.setdefault(group, parent)


os.register_at_fork(after_in_child=_after_fork_in_child)


def inherited_from(group: dist.ProcessGroup | None) -> int | None:
    """The process that had ``group`` (None: the world) when it forked this one, where
    this process inherited it; None for a group made here."""
    if not _inherited:  # every collective asks: a process that inherited none says so at once
        return None
    group = group if group is not None else dist.group.WORLD
    return None if group is None else _inherited.get(group)
