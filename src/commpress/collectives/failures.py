"""A compressed collective's transport error, named: the backend's own ("Timed out waiting
2000ms for recv operation to complete", "Operation timed out!", "Connection closed by
peer") says nothing of the collective it stopped, nor of the timeout that ran out."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

from commpress._torch_private import group_timeout
from commpress.ranks import this_rank
from commpress.transport import backends, owned_groups
from commpress.transport.backends import registered
from commpress.units import counted

#: What the backends' timeouts say (gloo: "Timed out waiting ...", "Operation timed out!",
#: and to the other transfers on a connection that timed out "Application timeout caused
#: pair closure"; NCCL: "... before timing out").
_CLOSED_BY_A_TIMEOUT = "application timeout"
_TIMEOUT_WORDS = ("timed out", "timing out", _CLOSED_BY_A_TIMEOUT)
#: What a call on a group destroyed (torch.distributed.destroy_process_group) says.
GROUP_DESTROYED = "its process group was destroyed (torch.distributed.destroy_process_group)"


class CollectiveTimeoutError(RuntimeError):
    """A compressed collective gave up waiting for a peer that stalled or died; its message
    names the collective, its ``__cause__`` is the backend's own error (a ``RuntimeError``,
    as this is)."""


def describe(name: str, codec, algorithm: str, group: dist.ProcessGroup | None) -> str:
    """'all_gather_into_tensor (int8@ring) on a group of 3 ranks (this is rank 0)'."""
    group = backends.or_world(group)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    this = this_rank(rank, dist.get_process_group_ranks(group))
    return f"{name} ({codec}@{algorithm}) on a group of {counted(size, 'rank')} (this is {this})"


@contextlib.contextmanager
def named_failures(
    name: str, codec, algorithm: str, group, timeout: timedelta | None, since: float | None = None
) -> Iterator[None]:
    """Name the collective (:func:`describe`) in a backend's error raised inside the body: a
    timeout becomes a :class:`CollectiveTimeoutError` that says how long it waited; any
    other plain ``RuntimeError`` (gloo's "Connection closed by peer", a peer that died)
    a ``RuntimeError`` that says when; either with the backend's error as its cause. One of
    a subclass of ``RuntimeError`` keeps its type (commpress's own, which say what they
    are; a backend's own, NCCL's: the same words added as a note). Once ``group`` is
    destroyed (before the call ran, or while it ran), a ``RuntimeError`` that says so, with
    torch's error (any type) as its cause. ``since``: when the collective was issued, a
    ``time.monotonic()`` (default: on entry), which the seconds said count from."""
    try:
        call = describe(name, codec, algorithm, group)
    except (KeyError, ValueError) as error:
        if group is None or registered(group):
            raise
        raise RuntimeError(
            f"commpress {name} ({codec}@{algorithm}) did not run: {GROUP_DESTROYED} before it "
            f"ran. torch said: {error}"
        ) from error
    refuse_inherited(f"{name} ({codec}@{algorithm})", group)
    with named_as(call, timeout, group, since=since):
        yield


def refuse_inherited(call: str, group: dist.ProcessGroup | None) -> None:
    """Raise a ``RuntimeError`` naming ``call`` where ``group`` (None: the world) is one this
    process inherited through a fork: its connections are its parent's, whose threads
    (gloo's event loop, its workers) are not in this process, so a transfer on it never
    completes here (gloo then hangs past any timeout, waiting for that loop to drop the
    connection), and one sent from here would reach the parent's peers among the parent's
    own."""
    parent = backends.inherited_from(group)
    if parent is not None:
        raise RuntimeError(
            f"commpress {call} did not run: its process group was made by process {parent} "
            "before it forked this one, and a process group works only in the process that "
            "made it (the backend's threads that move its data are not in this one): "
            "communicate from that process, or make a process group here "
            "(torch.distributed.destroy_process_group, then init_process_group)"
        )


@contextlib.contextmanager
def named_as(
    call: str,
    timeout: timedelta | None,
    group=None,
    cause: str = "a peer stalled or died",
    since: float | None = None,
) -> Iterator[None]:
    """:func:`named_failures` for any communication that ``call`` describes; with ``group``,
    any error of the body once ``group`` is destroyed says so. ``cause``: what a timeout's
    message gives as its likely cause; ``since``: as :func:`named_failures` takes it (a
    collective issued on one thread and waited for on another: the backend's clock runs
    from the issue)."""
    start = time.monotonic() if since is None else since
    try:
        yield
    except Exception as error:
        seconds = time.monotonic() - start
        if group is not None and not registered(group):
            raise RuntimeError(
                f"commpress {call} failed after {seconds:.1f} s: {GROUP_DESTROYED} while it ran. "
                f"torch said: {error}"
            ) from error
        if not isinstance(error, RuntimeError):
            raise
        timed_out = _timed_out(error)
        if type(error) is RuntimeError or timed_out or isinstance(error, dist.DistError):
            owned_groups.mark_failed(group)  # the backend's own error: a peer stalled or died
        if type(error) is not RuntimeError and not timed_out:
            raise
        if not timed_out:
            raise RuntimeError(f"commpress {call} failed after {seconds:.1f} s: {error}") from error
        limit = _what_ran_out(timeout, group, seconds)
        what = f"timed out after {seconds:.1f} s ({limit})"
        if _CLOSED_BY_A_TIMEOUT in str(error).lower():  # maybe an earlier call's, at once
            what = (
                f"failed after {seconds:.1f} s: a connection of its group was closed by a "
                f"timeout, this call's ({limit}) or an earlier call's on the group"
            )
        message = (
            f"commpress {call} {what}: {cause}; the group is not to be used "
            f"again, as after any failed torch.distributed collective. The backend said: {error}"
        )
        if type(error) is not RuntimeError:
            add_note(error, message)
            raise
        raise CollectiveTimeoutError(message) from error


def _what_ran_out(timeout: timedelta | None, group, seconds: float) -> str:
    """``timeout``, or the group's own where that is shorter and the call gave up before
    ``timeout``: the backend's collectives (gloo's) end at their group's timeout, whatever
    ``wait(timeout)`` is given."""
    if timeout is None:
        return "the process group's timeout"
    group = dist.group.WORLD if group is None else group
    own = group_timeout(group) if group is not None and registered(group) else None
    if own is not None and own < timeout and seconds < timeout.total_seconds():
        return (
            f"the process group's own timeout, {own}, which timeout={timeout} cannot "
            "lengthen for the backend's collectives: make the group with a longer one"
        )
    return f"timeout={timeout}"


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` where Python has it (3.11 on; pyproject takes 3.10, where the
    note is left out)."""
    getattr(error, "add_note", lambda _: None)(note)


def _timed_out(error: RuntimeError) -> bool:
    if isinstance(error, CollectiveTimeoutError):
        return False
    text = str(error).lower()
    return any(words in text for words in _TIMEOUT_WORDS)
