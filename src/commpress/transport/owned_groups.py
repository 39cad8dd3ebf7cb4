"""Process groups commpress makes for an object of its own: the twins of
``cp.fsdp.compress``, the group of ``cp.ddp.hook`` and of ``cp.lowrank.ddp_hook`` (given
none).

torch keeps every group until ``destroy_process_group``, each with its connections and the
backend's threads, so a group made per wrapped model stayed for as long as the process ran
(``commpress train``'s runs, a sweep, a notebook cell run again). Here a group belongs to
its owner alone while the owner lives (two live models never share one: their collectives
would interleave on it), and once the owner is gone it is free for the next request of the
same purpose, ranks, backend and timeout: a process keeps as many groups as it has live
wrappers. A group is not destroyed to be made again (ranks collect their garbage at
different times, and destroying an NCCL communicator can be a collective call).

Whether to reuse is agreed, since ``new_group`` must be called by every rank alike: every
rank offers the free groups it has for each request (:func:`offers`), the offers are
exchanged (by the caller, in the order of the compressed collectives given before), and a
group is taken over only where every rank offers it (:func:`take`); a group destroyed, or
one on which a collective failed (:func:`mark_failed`), is never offered, so the next owner
gets a new group; nor is one with a collective of torch's issued on it still pending (an
owner gone in the middle of a step, on one rank: the next owner's first collective would
meet it, and take its data), and once that collective has failed, never (:func:`track`);
not tracked: collectives on CUDA tensors. The point-to-point transfers of ``ring`` and
``ring-hop`` need no tracking on gloo: a call posts and waits for them on the communication
thread, and the offers are made there too, after every call given before
(:func:`commpress.integrations.groups.own_groups`). A call made on one rank alone and
dropped holds that thread until it times out, which marks its group failed; the next
owner's set-up waits behind it (its peers with it), then gets a new group where the
set-up's timeout outlasts the call's, and times out on every rank (an error, not a hang)
where it does not (the same timeout for both, as ``fsdp.compress(timeout=)`` gives). On
NCCL, where a wait without a timeout does not block the host, such a call may end before
its transfers do, unmarked (not run on a GPU). Requests that differ between ranks (another
timeout, say) raise on every rank, naming them. A failed group of its owner gone, nothing
of it pending, is destroyed when a later request's offers are made where gloo alone moves
its tensors (destroying a gloo group closes this process's connections and threads alone:
0.1 s with its peer away, and 5 file descriptors and 3 threads freed); elsewhere it stays
open until the world is made again (destroying an NCCL communicator could hang where its
peers do not do the same at once; not run on a GPU).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from datetime import timedelta

import torch.distributed as dist

from commpress.transport.backends import only_gloo, registered

#: What a group is for, its ranks in the world (None: all), backend and timeout as
#: ``new_group`` takes them.
Request = tuple[str, "tuple[int, ...] | None", "str | None", "timedelta | None"]


@dataclasses.dataclass
class _Made:
    group: object  # a ProcessGroup, NON_GROUP_MEMBER outside it, None once destroyed
    owner: weakref.ref | None = None

    def offered(self) -> bool:
        """Free (its owner gone), and usable; a group found destroyed is let go of here,
        so that its connections close (the entry keeps its place: every rank's list of a
        request must stay in step)."""
        if self.owner is not None and self.owner() is not None:
            return False
        if self.group is dist.GroupMember.NON_GROUP_MEMBER:
            return True
        if self.group is not None and not registered(self.group):
            self._let_go()
        if self.group is None or _pending(self.group):  # first: a failed one marks the group
            return False
        if self.group in _failed:
            if only_gloo(self.group):  # its connections and threads, closed here alone
                dist.destroy_process_group(self.group)
                self._let_go()
            return False
        return True

    def _let_go(self) -> None:
        """Drop the group, destroyed: no longer owned (its id may be another object's)."""
        _owned.discard(id(self.group))
        self.group = None


_made: dict[Request, list[_Made]] = {}
_made_in: list[weakref.ref] = [lambda: None]  # the world they were made in
_failed: weakref.WeakSet = weakref.WeakSet()
_owned: set[int] = set()  # the ids of the groups handed to owners, in this world
#: The collectives of torch's issued on each group (:func:`track`), until seen completed.
_in_flight: dict[object, list] = {}
_in_flight_lock = threading.Lock()


def track(group: dist.ProcessGroup | None, work, on_cpu: bool = True):
    """``work``, a collective of torch's just issued on ``group``; while it is pending, a group
    of an owner gone is offered to no one, and once it has failed, never again. Returns
    ``work``.

    Polled (``is_completed``), not called back: a Python callback on the future of a gloo
    collective still pending at interpreter exit aborted the process ("terminate called after
    throwing an instance of 'gloo::IoException'") where gloo's thread completed it during
    finalization. A ``Work`` without a future (gloo's ``reduce_scatter_tensor``'s, torch
    2.13) is not tracked: its ``is_completed`` never turns True, even once waited for. Nor
    is one on CUDA tensors (``on_cpu`` False): a group's last work, kept until the group's
    next, would keep its GPU memory (an FSDP all-gather's output) alive; and NCCL completes
    a work's future when it is queued, so its errors would not show. A work waited for to
    its end (:func:`waited`) is let go of at once: gloo's ``Work`` holds its tensors, and
    kept it held a DDP model's last gradient bucket after the model and its hook were gone."""
    if group is None or id(group) not in _owned or not _has_future(work):
        return work
    if not on_cpu:  # the last work of each group would keep its GPU tensors alive
        return work
    with _in_flight_lock:
        _in_flight[group] = [*_still_pending(group), work]
    return work


def waited(work) -> None:
    """``work`` was waited for and did not fail: no longer tracked (:func:`track`), so that
    its tensors go with their last user."""
    if not _in_flight:  # read without the lock: nothing tracked, nothing to let go of
        return
    with _in_flight_lock:
        for group, works in list(_in_flight.items()):
            if any(tracked is work for tracked in works):
                kept = [tracked for tracked in works if tracked is not work]
                if kept:
                    _in_flight[group] = kept
                else:
                    del _in_flight[group]
                return


def _has_future(work) -> bool:
    try:
        work.get_future()
    except RuntimeError:  # "Work::getFuture not implemented."
        return False
    return True


def _still_pending(group: object) -> list:
    """The works on ``group`` not completed yet; one completed with an error (a peer stalled
    or died: gloo then closes the group's connections) marks the group failed."""
    pending = []
    for work in _in_flight.get(group, ()):
        if not work.is_completed():
            pending.append(work)
        elif _ended_in_error(work):
            mark_failed(group)
    return pending


def _ended_in_error(work) -> bool:
    try:
        work.get_future().value()
    except Exception:  # noqa: BLE001 - any error of the backend's
        return True
    return False


def _pending(group: object) -> bool:
    with _in_flight_lock:
        works = _still_pending(group)
        if works:
            _in_flight[group] = works
        else:
            _in_flight.pop(group, None)
        return bool(works)


def mark_failed(group: dist.ProcessGroup | None) -> None:
    """A collective on ``group`` failed: it is never handed to another owner."""
    if group is not None and group is not dist.GroupMember.NON_GROUP_MEMBER:
        _failed.add(group)


def offers(requests: list[Request]) -> list[tuple[int, list[int]]]:
    """What this rank offers for each of ``requests``: how many groups it has made for it,
    and which of them (by position) are free and usable. Every rank's are exchanged before
    :func:`take`."""
    if _made_in[0]() is not dist.group.WORLD:  # a world made again: its groups are new
        _made.clear()
        _owned.clear()
        _made_in[0] = weakref.ref(dist.group.WORLD)
    made = [_made.get(request, []) for request in requests]
    return [(len(entries), [i for i, e in enumerate(entries) if e.offered()]) for entries in made]


def take(owner: object, requests: list[Request], everyone: list) -> list:
    """A group for each of ``requests``, ``owner``'s alone until it is garbage-collected: one
    that every rank offers (``everyone``: every rank's ``(requests, offers(requests))``), or
    a new one (``new_group``, on every rank alike, since every rank decides from the same
    ``everyone``). Raises ``ValueError`` on every rank where the ranks' requests differ."""
    mine = everyone[dist.get_rank()][0]
    differing = [rank for rank, (theirs, _) in enumerate(everyone) if theirs != mine]
    if differing:
        raise ValueError(
            f"ranks {differing} asked for other process groups than rank {dist.get_rank()} "
            f"({everyone[differing[0]][0]} against {requests}): every rank must pass the same "
            "arguments (timeout included)"
        )
    groups = []
    for index, request in enumerate(requests):
        counts = {offered[index][0] for _, offered in everyone}
        made = _made.setdefault(request, [])
        common = set.intersection(*(set(offered[index][1]) for _, offered in everyone))
        if len(counts) > 1:  # a new_group failed on some ranks: start this list afresh
            made.clear()
            common = set()
        if not common:
            _, ranks, backend, group_timeout = request
            members = None if ranks is None else list(ranks)
            made.append(_Made(dist.new_group(members, timeout=group_timeout, backend=backend)))
        entry = made[min(common)] if common else made[-1]
        entry.owner = weakref.ref(owner)
        _owned.add(id(entry.group))
        groups.append(entry.group)
    return groups
