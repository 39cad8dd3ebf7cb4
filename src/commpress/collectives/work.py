"""Handles of compressed collectives, which run on one communication thread per process.

Every compressed collective, synchronous or not, is queued on the same single
thread, so commpress operations run in the order the program issued them on
every rank. Integrations give commpress its own process groups, so torch's own
collectives on the user's groups never interleave with ours.

On CUDA, commpress keeps torch.distributed's stream contract: a collective is
ordered after the work already queued on the caller's current stream (an event
recorded there at issue, waited for by the communication stream), and once
``wait()`` returns, or the ``torch.futures.Future`` of :meth:`CollectiveWork.torch_future`
completes, the output is safe to use on the waiter's current stream (which waits
for an event recorded on the communication stream when the collective finished).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch

from commpress.collectives.checks import check_timeout
from commpress.collectives.failures import named_failures
from commpress.collectives.workspace import workspace
from commpress.transport import backends
from commpress.transport.p2p import wait as wait_work
from commpress.units import counted

#: ``active`` on the communication thread: whatever runs there (a collective, or a
#: callback its completion runs) is on it.
_on_comm_thread = threading.local()


def _mark_comm_thread() -> None:
    _on_comm_thread.active = True


def _new_executor() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="commpress", initializer=_mark_comm_thread
    )


_executor = _new_executor()


def _after_fork_in_child() -> None:
    """A forked child has only the thread that forked: the executor inherited from the
    parent counts a communication thread that is not there, and would queue every
    collective for it forever. The child starts its own (and a child forked from the
    communication thread is not on it any more). The parent's collectives still pending
    never finish here: they fail once the child uses commpress (:func:`_fail_orphans`)."""
    global _executor, _orphans
    _executor = _new_executor()
    _on_comm_thread.active = False
    _last_queued.clear()
    # a child that never used commpress and forks again passes its parent's on
    _orphans = (_orphans[0] + list(_pending), os.getppid())
    _pending.clear()


def _fail_orphans() -> None:
    """Fail, in a forked child, the collectives its parent had pending at the fork, so that
    their ``torch_future()`` completes (with the error): at the child's first use of
    commpress, on its thread, not in the fork handler nor in a child that never uses
    commpress (a data loader's worker), where the parent's callbacks have no business. A
    torch future handed out before the fork and waited on in a child that has not used
    commpress stays pending there."""
    global _orphans
    orphans, parent = _orphans
    if not orphans:
        return
    _orphans = ([], parent)
    for future in orphans:
        # one may have finished as the parent forked
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            future.set_exception(_orphaned_error(parent))


#: In a forked child, the parent's collectives pending at the fork (not failed yet), and
#: the parent's process id.
_orphans: tuple[list[concurrent.futures.Future], int] = ([], 0)


def _orphaned_error(process: int) -> RuntimeError:
    return RuntimeError(
        f"a commpress collective started by process {process}, which forked this one "
        "before it finished: it runs on that process's communication thread and never "
        "finishes here"
    )


#: Every collective queued and not finished yet (failed in a forked child).
_pending: set[concurrent.futures.Future] = set()


def _submit(run: Callable[[], None]) -> concurrent.futures.Future:
    future = _executor.submit(run)
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    return future


def release_workspace() -> int:
    """Free the memory commpress keeps between collectives (:mod:`~commpress.collectives.
    workspace`); the number of bytes freed. Refused while a commpress collective is queued
    or running: its buffers are that memory. The release itself runs on the communication
    thread, so that a collective launched meanwhile from another thread runs after it; so
    it is refused on that thread too (in a callback of a commpress future), which would
    wait on itself."""
    if getattr(_on_comm_thread, "active", False):
        raise RuntimeError(
            "release_workspace cannot be called on commpress's communication thread (in a "
            "callback of a commpress future): call it from the thread that waits"
        )
    unfinished = sum(not future.done() for future in list(_pending))
    if unfinished:
        raise RuntimeError(
            f"release_workspace: {counted(unfinished, 'commpress collective')} queued or "
            "running (their scratch buffers are what it frees): wait for them first"
        )

    def release() -> int:
        held = workspace.held_bytes()
        workspace.release()
        return held

    return _executor.submit(release).result()


#: The last asynchronous compressed collective given to each group, until it has finished
#: (:func:`queued_on`); weakly keyed, so a destroyed group is not kept.
_last_queued: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

os.register_at_fork(after_in_child=_after_fork_in_child)
#: The communication thread's stream on each CUDA device (created on first use).
_streams: dict[torch.device, torch.cuda.Stream] = {}


def cuda_device(*tensors: torch.Tensor) -> torch.device | None:
    """The CUDA device of the collective's tensors, or None when they live on the CPU."""
    for tensor in tensors:
        if tensor.is_cuda:
            return tensor.device
    return None


class StreamOrder:
    """The CUDA events that order one collective between the caller and the comm stream."""

    def __init__(self, device: torch.device, tensors: tuple[torch.Tensor, ...]):
        self.device = device
        self.stream = _streams.get(device)
        if self.stream is None:
            self.stream = _streams.setdefault(device, torch.cuda.Stream(device))
        self.ready = torch.cuda.Event()
        self.ready.record(torch.cuda.current_stream(device))  # the producer's work so far
        self.done = torch.cuda.Event()
        for tensor in tensors:  # the caller may free them before the comm stream is done
            tensor.record_stream(self.stream)

    @contextlib.contextmanager
    def on_comm_stream(self) -> Iterator[None]:
        """Run the body on the comm stream, after the producer; record completion after."""
        self.stream.wait_event(self.ready)
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
                yield
        finally:  # also after an error: kernels already queued may still write the output
            self.done.record(self.stream)

    def make_current_stream_wait(self) -> None:
        torch.cuda.current_stream(self.device).wait_event(self.done)


class WaitTimeoutError(TimeoutError, RuntimeError):
    """``wait(timeout)`` ran out before its collective finished (which goes on): a
    ``TimeoutError``, and a ``RuntimeError`` as from torch's ``Work.wait(timeout)``."""


class CollectiveWork:
    """Like torch's ``Work``: ``wait()`` blocks (and re-raises), ``is_completed()`` polls."""

    def __init__(
        self,
        future: concurrent.futures.Future,
        order: StreamOrder | None = None,
        output: torch.Tensor | None = None,
    ):
        self._future = future
        self._order = order
        self._output = output  # the value of get_future(), as torch's
        self._process = os.getpid()  # whose communication thread runs it

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Until the collective has finished (bounded by its own timeout), or at most
        ``timeout`` (then :class:`WaitTimeoutError`); ``timedelta(0)`` means no bound, as for
        torch's ``Work.wait``."""
        if timeout == timedelta(0):
            timeout = None
        check_timeout(timeout)
        _fail_orphans()
        if os.getpid() != self._process and not self._future.done():
            raise _orphaned_error(self._process)
        if getattr(_on_comm_thread, "active", False) and not self._future.done():
            raise RuntimeError(
                "wait() on a commpress collective that has not finished, called on "
                "commpress's communication thread (from a callback of another collective's "
                "future, say): it is queued behind this callback and would never finish; "
                "wait from another thread"
            )
        try:
            # with a timeout, not result(timeout=...): its TimeoutError is the builtin one,
            # which the collective itself may raise (a socket's), and would be taken for the
            # wait's; without one, on the future's own condition (no waiter made per call)
            if timeout is not None:
                seconds = timeout.total_seconds()
                if not concurrent.futures.wait([self._future], timeout=seconds).done:
                    raise WaitTimeoutError(f"collective did not complete within {timeout}")
            error = self._future.exception()
            if error is not None:
                raise _copy_of(error)
        finally:
            if self._order is not None and self._future.done():
                self._order.make_current_stream_wait()
            self = error = None  # the error's traceback holds this frame
        return True

    def is_completed(self) -> bool:
        """Also in a child forked before it finished, where it never finishes (``wait()``
        raises)."""
        _fail_orphans()
        return self._future.done() or os.getpid() != self._process

    def get_future(self) -> torch.futures.Future:
        """As torch's ``Work.get_future()``: a future completed with ``[output]`` (the
        collective's output tensor) once it finishes, or with its error (so a DDP hook
        written as torch's, ``work.get_future().then(...)``, takes a compressed
        collective as it takes torch's own)."""
        if self._output is None:
            raise RuntimeError("this commpress operation has no output tensor for a future")
        return self.torch_future([self._output])

    def torch_future(self, value, before: Callable[[], None] | None = None) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with ``value`` (or this work's error) when the
        collective finishes; completing it never blocks a thread. ``before`` runs first, so
        whoever waits on the future sees its effects. On CUDA the future carries its device,
        and is completed on the comm stream: a waiter's current stream waits for it. torch
        records that completion event only on the devices of the tensors in ``value``, so on
        CUDA ``value`` must be a tensor on the collective's device (the output), or a list
        of them."""
        _fail_orphans()
        order = self._order
        tensors = value if isinstance(value, list) else [value]
        if order is not None and not (
            tensors
            and all(isinstance(t, torch.Tensor) and t.device == order.device for t in tensors)
        ):
            raise ValueError(
                f"value must be a tensor on {order.device} (the collective's output), or a "
                "list of them: a CUDA future completed without one orders no stream after "
                "the collective"
            )
        future = torch.futures.Future(devices=[order.device]) if order else torch.futures.Future()
        # taken out as it runs: the communication thread keeps the handle of its call (and
        # so this callback) until it takes its next call, and a waiter the future wakes may
        # have dropped the value (a DDP bucket) and the future by then
        completing = [(future, value)]

        def complete(done: concurrent.futures.Future) -> None:
            future, value = completing.pop()
            error = done.exception()
            if before is not None:
                try:
                    before()
                except Exception as failure:  # noqa: BLE001 - a waiter must hear of it
                    error = error or failure
            if error is not None:
                future.set_exception(error)
                return
            if order is None:
                future.set_result(value)
                return
            with torch.cuda.device(order.device), torch.cuda.stream(order.stream):
                future.set_result(value)  # records an event on the comm stream

        self._future.add_done_callback(complete)
        return future


def _copy_of(error: BaseException) -> BaseException:
    """``error`` as a new exception, with its message, cause and traceback so far, to raise
    in a waiter: the future keeps ``error``, which raised itself would gain the waiter's
    frames, among them a caller's that holds the handle, and so the error again (a cycle
    that kept the caller's tensors and group until a gc pass). ``error`` itself where its
    type cannot be rebuilt from its arguments as it was (an ``__init__`` that formats its
    arguments would format them twice): its message before the cycle's."""
    try:
        fresh = copy.copy(error)
    except Exception:  # noqa: BLE001 - a type whose arguments do not rebuild it
        return error
    if fresh.args != error.args or str(fresh) != str(error):
        return error
    fresh.__cause__, fresh.__context__ = error.__cause__, error.__context__
    fresh.__suppress_context__ = error.__suppress_context__
    return fresh.with_traceback(error.__traceback__)


def for_ddp(future: torch.futures.Future) -> torch.futures.Future:
    """``future`` as a DDP communication hook returns it: DDP's C++ reads the value of the
    future it is given as a tensor, and a future completed by ``set_exception`` holds the
    exception as its value ("Unable to cast <the error> to Tensor"); a future chained after
    it raises the error itself, as torch's own hooks chain theirs."""
    return future.then(_value)


def _value(future: torch.futures.Future):
    return future.value()


def writable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or where a collective may write in place for it: a fresh contiguous
    tensor (copy the result in with :func:`write_into`) for a strided one, which the
    schedules cannot write, and for one made under inference mode, which is the calling
    thread's: only under it may such a tensor be written in place."""
    if tensor.is_contiguous() and not tensor.is_inference():
        return tensor
    with torch.inference_mode(False):
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)


def write_into(tensor: torch.Tensor, value: torch.Tensor) -> None:
    """``tensor.copy_(value)``, under inference mode if ``tensor`` was made under it (not
    ``inference_mode(False)`` otherwise: that turns grad mode on)."""
    if not tensor.is_inference():
        tensor.copy_(value)
        return
    with torch.inference_mode():
        tensor.copy_(value)


def launch(
    run: Callable[[], None], async_op: bool, tensors: tuple[torch.Tensor, ...] = ()
) -> CollectiveWork | None:
    """Queue ``run`` on the communication thread; wait for it unless ``async_op``.

    ``tensors``: the collective's output (first) and inputs. On CUDA they order ``run``
    after the caller's current stream and the caller's stream after ``run`` (module doc).
    """
    if not async_op and getattr(_on_comm_thread, "active", False):
        raise RuntimeError(
            "a synchronous commpress collective was called on commpress's communication "
            "thread (from a callback of another collective's future, say): it would wait "
            "for itself forever; call it with async_op=True, or from another thread"
        )
    _fail_orphans()
    device = cuda_device(*tensors)
    order = StreamOrder(device, tensors) if device is not None else None
    # taken out as it starts: the thread lets go of ``run`` (and the tensors it holds, a
    # DDP bucket) before the call is reported done, not when its next task comes
    queued = [run]

    def on_thread() -> None:
        task = queued.pop()
        # collectives are not differentiable: an output that requires grad (a parameter,
        # say) is written in place, as torch's all_reduce writes it
        with torch.no_grad():
            if order is None:
                task()
                return
            with order.on_comm_stream():
                task()

    output = tensors[0] if tensors else None
    work = CollectiveWork(_submit(on_thread), order, output)
    if async_op:
        return work
    try:
        work.wait()
    finally:
        work = None  # the error's traceback holds this frame, and work the error
    return None


def in_queue_order(run: Callable[[], None], device: torch.device | None = None) -> None:
    """Run ``run`` (a collective of commpress's own) after every compressed collective
    given before it, on the communication thread, and wait for it; at once where this is
    that thread (what was given before has run). Issued from the calling thread, it could
    reach the backend before a queued collective on one rank and after it on another.
    ``device``: a CUDA device made current around ``run`` (the communication thread's own
    current one is cuda:0 on every rank); None or another type: nothing."""

    def placed() -> None:
        place = torch.cuda.device(device) if device is not None and device.type == "cuda" else None
        with place or contextlib.nullcontext():
            run()

    if getattr(_on_comm_thread, "active", False):
        placed()
        return
    launch(placed, async_op=False)


def queued_on(group, work: CollectiveWork | None) -> CollectiveWork | None:
    """``work``, what :func:`launch` returned for a compressed collective on ``group``; an
    asynchronous one is remembered while it has not finished (:func:`run_native`)."""
    if work is not None:
        key, future = backends.or_world(group), work._future
        _last_queued[key] = future
        group_ref = weakref.ref(key)  # the handle keeps its callbacks: not the group
        future.add_done_callback(lambda done: _forget(group_ref(), done))
    return work


def _forget(key, done: concurrent.futures.Future) -> None:
    if key is not None and _last_queued.get(key) is done:
        _last_queued.pop(key, None)


def run_native(
    name: str,
    start: Callable[[], object],
    group,
    async_op: bool,
    timeout,
    tensors: tuple[torch.Tensor, ...],
    copy_back: Callable[[], None] | None = None,
):
    """torch's own collective ``name`` on ``group`` (``start()`` issues it and returns its
    ``Work``), as torch runs it; but behind a compressed collective given to the group before
    that may still be queued on the communication thread, it is queued there too, and so is
    one with a ``copy_back`` to run once it has finished (a strided output staged through
    a contiguous copy: gloo reads and writes a strided tensor's storage as if it were
    contiguous). Issued at
    once on the calling thread, one rank could hand the two to the backend in one order and
    its peer in the other, which gloo takes for a mismatch (it ends the process). A failure
    waited for here is named as a compressed collective's (torch's own ``Work``, returned
    for ``async_op``, raises torch's error)."""

    def waited(work, issued: float) -> None:
        with named_failures(name, "none", "native", group, timeout, since=issued):
            wait_work(work, timeout)

    def run() -> None:
        issued = time.monotonic()
        waited(start(), issued)
        if copy_back is not None:
            copy_back()

    if copy_back is not None or _behind_queued(group):  # and the next native call behind it
        return queued_on(group, launch(run, async_op, tensors))
    issued = time.monotonic()
    work = start()
    return work if async_op else waited(work, issued)


def staged(
    tensor: torch.Tensor, read: bool = False
) -> tuple[torch.Tensor, Callable[[], None] | None]:
    """``(tensor, None)``, or for a strided ``tensor`` a contiguous one of its own and what
    copies the result back into ``tensor`` (``copy_back`` of :func:`run_native`): holding
    ``tensor``'s values where the collective ``read``s them (an all-reduce), else fresh
    (:func:`writable`: an output the collective only writes)."""
    if tensor.is_contiguous():
        return tensor, None
    copy = tensor.contiguous() if read else writable(tensor)
    return copy, lambda: write_into(tensor, copy)


def _behind_queued(group) -> bool:
    if getattr(_on_comm_thread, "active", False):  # what was given before has run
        return False
    future = _last_queued.get(backends.or_world(group))
    return future is not None and not future.done()
