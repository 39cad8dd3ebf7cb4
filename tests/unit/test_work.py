"""Handles of compressed collectives (``commpress.collectives.work``) without a GPU."""

from __future__ import annotations

import concurrent.futures
import gc
import os
import threading
import traceback
import weakref
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from commpress.collectives.work import CollectiveWork, launch


@pytest.mark.parametrize("value", [None, "a CPU tensor"])
def test_a_cuda_future_without_a_tensor_on_the_device_is_refused(value):
    """torch records a CUDA future's completion event only on the devices of its value's
    tensors: without one, a waiter's stream would be ordered after nothing."""
    value = torch.zeros(1) if value == "a CPU tensor" else value
    order = SimpleNamespace(device=torch.device("cuda", 0))
    work = CollectiveWork(concurrent.futures.Future(), order)
    with pytest.raises(ValueError, match=r"value must be a tensor on cuda:0"):
        work.torch_future(value)


def test_a_cpu_future_completes_with_its_value_after_before():
    done, seen = concurrent.futures.Future(), []
    value = torch.arange(3)
    future = CollectiveWork(done).torch_future(value, before=lambda: seen.append("before"))
    assert not future.done()
    done.set_result(None)
    assert seen == ["before"] and future.wait() is value


def test_a_synchronous_collective_called_on_the_communication_thread_raises_not_hangs():
    """From a callback of another collective's future: it would queue behind itself."""
    release, inner = threading.Event(), concurrent.futures.Future()

    def callback(_):
        try:
            launch(lambda: None, async_op=False)
        except RuntimeError as error:
            inner.set_result((threading.current_thread().name, str(error)))
        else:
            inner.set_result((threading.current_thread().name, None))

    work = launch(lambda: release.wait(10), async_op=True)
    work._future.add_done_callback(callback)  # before it is done: runs where it completes
    release.set()
    work.wait()
    thread, error = inner.result(timeout=10)
    assert thread.startswith("commpress") and "communication thread" in error
    # an asynchronous one from there is queued as usual, and this thread may still wait
    assert launch(lambda: None, async_op=True).wait()


def test_waiting_on_the_communication_thread_for_a_later_collective_raises_not_hangs():
    """A callback of one collective's future that waits for a collective queued after it
    (on the same single thread) waited forever."""
    release, outcome = threading.Event(), concurrent.futures.Future()
    first = launch(lambda: release.wait(10), async_op=True)
    later = launch(lambda: None, async_op=True)

    def callback(_):
        try:
            later.wait()
        except RuntimeError as error:
            outcome.set_result(str(error))
        else:
            outcome.set_result(None)

    first._future.add_done_callback(callback)
    release.set()
    assert "has not finished, called on commpress's communication thread" in outcome.result(10)
    assert later.wait()  # from this thread, as usual


def test_a_failing_before_fails_the_future_instead_of_leaving_it_pending():
    done = concurrent.futures.Future()
    future = CollectiveWork(done).torch_future(torch.zeros(1), before=lambda: 1 / 0)
    done.set_result(None)
    with pytest.raises(ZeroDivisionError):
        future.wait()


def test_an_error_feedback_residual_made_under_inference_mode_is_refused():
    """The collective updates it in place, which only inference mode may do to it."""
    from commpress.collectives.checks import check_residual

    inp = torch.zeros(8)
    with torch.inference_mode():
        residual = torch.zeros(8)
    with pytest.raises(ValueError, match="residual was made under torch.inference_mode"):
        check_residual(residual, inp, "alltoall")
    check_residual(torch.zeros(8), inp, "alltoall")


def test_a_forked_child_runs_collectives_on_a_communication_thread_of_its_own():
    """Only the forking thread survives a fork: a child of a process whose communication
    thread had started queued every collective for a thread that was not there."""
    launch(lambda: None, async_op=False)  # the parent's communication thread is running
    child = os.fork()
    if child == 0:  # the child: exit 0 once a collective queued there has run
        try:
            ran = launch(lambda: None, async_op=True)
            ran.wait(timedelta(seconds=30))
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _child_exit_code(child: int, seconds: float = 60.0) -> int | None:
    """The forked ``child``'s exit code, or None (and the child killed) if it hangs."""
    import signal
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    return None


def _child_passes(check, seconds: float = 30.0) -> bool:
    """Fork; the child exits 0 where ``check()`` is true (2 where false, 1 where it
    raises); whether it did so within ``seconds``."""
    child = os.fork()
    if child == 0:
        try:
            os._exit(0 if check() else 2)
        except BaseException:
            os._exit(1)
    return _child_exit_code(child, seconds) == 0


def test_a_child_forked_from_the_communication_thread_is_not_on_it():
    """The child's one thread kept the communication thread's mark, and its synchronous
    collectives were refused as if called from a callback."""

    def fork() -> int:
        child = os.fork()
        if child == 0:
            try:
                launch(lambda: None, async_op=False)
                os._exit(0)
            except BaseException:
                os._exit(1)
        return child

    forked = concurrent.futures.Future()
    launch(lambda: forked.set_result(fork()), async_op=True).wait(timedelta(seconds=30))
    assert _child_exit_code(forked.result()) == 0


def test_a_collective_pending_at_a_fork_raises_in_the_child_instead_of_hanging():
    """A collective still running when the process forked never finishes in the child (its
    communication thread stayed in the parent): waiting for it there hung for good."""
    release = threading.Event()
    pending = launch(release.wait, async_op=True)

    def raises_as_orphaned() -> bool:
        try:
            pending.wait()
        except RuntimeError as error:
            return "forked this one" in str(error)
        return False

    try:
        assert _child_passes(raises_as_orphaned, seconds=20)
    finally:
        release.set()
    assert pending.wait(timedelta(seconds=30))  # the parent's own wait is unaffected


def _fails_as_orphaned(future: torch.futures.Future, seconds: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        future.wait()
    except RuntimeError as error:
        return "forked this one" in str(error)
    return False


def test_a_collective_pending_at_a_fork_completes_its_futures_with_the_error_in_the_child():
    """Its ``wait()`` raised in the child, but ``is_completed()`` stayed False and its
    ``torch_future()``, made before the fork or after, never completed."""
    release = threading.Event()
    pending = launch(release.wait, async_op=True)
    before = pending.torch_future(torch.zeros(1))

    def fails_every_future() -> bool:
        after = pending.torch_future(torch.zeros(1))
        completed = pending.is_completed()
        return completed and _fails_as_orphaned(before) and _fails_as_orphaned(after)

    try:
        assert _child_passes(fails_every_future)
    finally:
        release.set()
    assert pending.wait(timedelta(seconds=30)) and torch.equal(before.wait(), torch.zeros(1))


def test_a_forked_child_that_does_not_use_commpress_runs_none_of_the_parents_callbacks(
    tmp_path,
):
    """A data loader's worker forked while a collective was pending ran the parent's
    callbacks (DDP's and FSDP's chains, on CUDA their stream guards) on a thread of its
    own: the parent's futures fail in a child only once it uses commpress."""
    release, marker = threading.Event(), tmp_path / "ran"
    pending = launch(release.wait, async_op=True)
    chained = pending.torch_future(torch.zeros(1)).then(
        lambda _: marker.write_text(str(os.getpid()))
    )

    def runs_no_callback() -> bool:
        import time

        time.sleep(0.5)  # what a thread started at the fork would have done by now
        return not marker.exists()

    try:
        assert _child_passes(runs_no_callback, seconds=20)
    finally:
        release.set()
    chained.wait()
    assert marker.read_text() == str(os.getpid())  # the parent's callback ran in the parent


def test_a_fork_while_the_native_build_lock_is_held_leaves_the_child_able_to_build():
    """A fork while another thread built the C kernels left the child's lock held: its
    first native kernel waited for good."""
    from commpress.codecs import native

    native.load()  # built (or found in the cache) before the fork
    with native._lock:  # another thread's build, as the fork sees it
        child = os.fork()
        if child == 0:
            try:
                native._libraries.clear()  # so that the child takes the lock to load again
                os._exit(0 if native.load() is not None else 2)
            except BaseException:
                os._exit(1)
    assert _child_exit_code(child) == 0


def test_a_finished_compressed_call_is_not_remembered_for_its_group():
    """The handle kept so that a native call queues behind it held the call's output (and
    the group) until the next native call on the group, which FSDP's twin groups never
    make."""
    import gc
    import weakref

    from commpress.collectives import work as works

    class Group:  # a process group, as far as the memory is concerned
        pass

    group, release = Group(), threading.Event()
    work = works.queued_on(group, launch(release.wait, async_op=True))
    assert works._behind_queued(group)
    release.set()
    work.wait(timedelta(seconds=30))
    # the future's callbacks run on the communication thread after wait() has returned,
    # before that thread takes its next call
    launch(lambda: None, async_op=False)
    assert not works._behind_queued(group) and group not in works._last_queued
    gone = weakref.ref(group)
    del group
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("async_op", [False, True])
def test_a_collective_that_raises_a_timeout_error_of_its_own_raises_it_from_wait(async_op):
    """``TimeoutError`` is ``concurrent.futures.TimeoutError``: the collective's own (a
    socket's, say) was taken for the wait's, and raised as "collective did not complete
    within None", its message dropped."""

    def fails():
        raise TimeoutError("the multicast socket timed out")

    with pytest.raises(TimeoutError, match="the multicast socket timed out"):
        work = launch(fails, async_op=async_op)
        work.wait(timeout=timedelta(seconds=30))


def test_a_wait_that_times_out_says_so_and_the_collective_goes_on():
    """Its error is also a ``RuntimeError``, as torch's ``Work.wait(timeout)`` raises (and
    the handle of a ``native`` call, torch's own or commpress's by whether a compressed call
    was still queued): it was the builtin ``TimeoutError`` alone."""
    release = threading.Event()
    work = launch(release.wait, async_op=True)
    with pytest.raises(TimeoutError, match="did not complete within 0:00:00.050000") as caught:
        work.wait(timeout=timedelta(milliseconds=50))
    assert isinstance(caught.value, RuntimeError)
    release.set()
    assert work.wait() is True


def test_the_work_fsdp_waits_on_takes_a_timeout():
    """``FutureWork.wait(timeout)`` waited for good, whatever the timeout."""
    from commpress.integrations.fsdp import FutureWork

    release = threading.Event()
    pending = launch(release.wait, async_op=True)
    handed = FutureWork(pending.torch_future(torch.zeros(1)), pending)
    try:
        with pytest.raises(TimeoutError, match="did not complete within"):
            handed.wait(timedelta(seconds=0.2))
    finally:
        release.set()
    # a zero timeout is torch's "none", what its C++ passes for wait(): refused before
    assert handed.wait(timedelta(0)) and handed.is_completed()


def test_a_grandchild_fails_the_collectives_pending_at_its_grandparents_fork():
    """A child that never used commpress and forked again handed its parent's pending
    collectives to nobody: the grandchild's future of one stayed pending for good."""
    release = threading.Event()
    pending = launch(release.wait, async_op=True)

    def grandchild_fails_it() -> bool:
        return _child_passes(lambda: _fails_as_orphaned(pending.torch_future(torch.zeros(1))))

    try:
        assert _child_passes(grandchild_fails_it, seconds=40)
    finally:
        release.set()


def test_a_native_call_before_init_process_group_says_so():
    """The check for a compressed call queued before it looked the default group up in a
    weak dictionary, where there is none yet: "cannot create weak reference to 'NoneType'
    object", instead of torch's own word."""
    import torch.distributed as dist

    import commpress as cp

    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        cp.all_reduce(torch.ones(1), algorithm="native")


@pytest.fixture
def lingering(monkeypatch):
    """The communication thread lingers 0.5 s after each call, holding its handle (as it
    does, briefly, until it takes its next call): what a waiter woken by a call's end
    still finds alive. ``finished()`` returns once that thread has let go of it."""
    import concurrent.futures.thread as pool
    import time

    finish = pool._WorkItem.run

    def run(item):
        finish(item)
        # the thread's own frame still holds it; this one would be in a cycle with its error
        del item
        time.sleep(0.5)

    monkeypatch.setattr(pool._WorkItem, "run", run)
    finished = lambda: launch(lambda: None, async_op=False)  # noqa: E731
    yield finished
    finished()  # the thread is out of the patched call before it is undone


def _a_failing_collective_holding_a_group():
    """A collective's ``run`` that raises, holding a group; and a weak reference to it."""

    class Group:
        pass

    group = Group()
    freed = weakref.ref(group)

    def run(group=group):
        raise RuntimeError("a peer stalled")

    return run, freed


def test_a_failed_synchronous_collective_frees_what_its_frames_held_without_a_gc_pass(
    lingering,
):
    """The error's traceback holds the frames it was re-raised through: the handle in one
    of them held the error again, a cycle that kept the collective's tensors and group
    until a gc pass (past destroy_process_group, and at exit into finalization). The
    communication thread lets go of the call's handle, which holds the error too, only
    after the caller has woken: looked at once it has."""
    run, freed = _a_failing_collective_holding_a_group()
    gc.disable()
    try:
        with pytest.raises(RuntimeError, match="a peer stalled"):
            launch(run, async_op=False)
        del run
        lingering()
        assert freed() is None
    finally:
        gc.enable()


def test_a_failed_handle_waited_in_a_caller_frees_what_it_held_without_a_gc_pass(lingering):
    """wait() raised the error its future keeps: its traceback gained the caller's frame,
    which held the handle, which held the error (a cycle that kept the collective's
    tensors and group until a gc pass), and grew with each wait. Each wait raises a copy,
    of the same type and message, with the communication thread's frames (which lets go of
    the handle after the caller has woken: looked at once it has)."""
    run, freed = _a_failing_collective_holding_a_group()

    def caller(collective):
        work = launch(collective, async_op=True)
        depths = []
        for _ in range(2):
            with pytest.raises(RuntimeError, match="a peer stalled") as raised:
                work.wait()
            frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
            depths.append(len(frames))
            assert "run" in frames
            del raised  # its traceback holds this frame
        assert depths[0] == depths[1], depths

    gc.disable()
    try:
        caller(run)
        del run
        lingering()
        assert freed() is None
    finally:
        gc.enable()


class _RankFailed(RuntimeError):
    """An exception whose ``__init__`` formats its argument: rebuilt from its ``args``, it
    would read 'rank rank 3 failed failed'."""

    def __init__(self, rank):
        super().__init__(f"rank {rank} failed")


class _Timeout(RuntimeError):
    def __init__(self, *, seconds):
        super().__init__(f"no answer in {seconds} s")
        self.seconds = seconds


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (_RankFailed(3), "rank 3 failed"),
        (_Timeout(seconds=5), "no answer in 5 s"),
        (OSError(104, "Connection reset by peer"), "[Errno 104] Connection reset by peer"),
    ],
)
def test_a_failed_handle_raises_its_error_with_the_message_and_type_it_had(error, message):
    def run():
        raise error

    work = launch(run, async_op=True)
    for _ in range(2):
        with pytest.raises(type(error)) as raised:
            work.wait()
        assert str(raised.value) == message
    assert getattr(raised.value, "seconds", 5) == 5


def test_wait_with_a_timeout_of_zero_waits_without_a_bound_as_torchs_work_does():
    """torch's Work.wait(timedelta(0)) means no timeout; commpress's raised ValueError."""
    started, release = threading.Event(), threading.Event()

    def run():
        started.set()
        release.wait(10)

    work = launch(run, async_op=True)
    started.wait(10)
    threading.Timer(0.2, release.set).start()
    assert work.wait(timedelta(0)) is True and work.is_completed()
    with pytest.raises(ValueError, match="timeout"):
        work.wait(timedelta(seconds=-1))


@pytest.mark.parametrize("fails", [False, True], ids=["done", "failed"])
def test_a_torch_future_waiter_finds_its_value_let_go_while_the_thread_lingers(fails, lingering):
    """The callback completing a ``torch_future`` kept its value (a DDP bucket) and the
    future itself for as long as the communication thread held the call's handle, which it
    does until it takes the next call: a waiter woken by the future could drop the bucket
    and find it still alive (the cold CI failed test_a_hook_gone_keeps_no_bucket_of_its_
    model so, after 608efa2)."""
    release = threading.Event()
    value = torch.ones(1000)
    freed = weakref.ref(value)

    def holding(tensor):  # a call holding the value too, as a DDP hook's its bucket
        def run():
            release.wait(30)  # until the future's callback is added
            tensor.mul_(2)

        return run

    def failing():  # whose frames, in the error's traceback, are the caller's to drop
        release.wait(30)
        raise RuntimeError("a peer stalled")

    work = launch(failing if fails else holding(value), async_op=True)
    future = work.torch_future(value)
    del value, work
    release.set()
    if fails:
        with pytest.raises(RuntimeError, match="a peer stalled"):
            future.wait()
    else:
        future.wait()
    del future
    gc.collect()
    assert freed() is None, "the communication thread kept the future's value"
