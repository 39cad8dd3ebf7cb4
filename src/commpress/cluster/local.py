"""Run a function on N local processes joined by a torch.distributed process group.

Used by the tests and benchmarks: ``run_distributed(fn, world_size, *args)`` returns
``[fn(rank, world_size, *args) for each rank]``. A rank that raises, dies or
outlives ``timeout`` fails the whole run with that rank's traceback, and every
process is ended before this function returns.

Ranks are forked from a server process that has imported torch and commpress once
(multiprocessing's ``forkserver``), without paying the imports (seconds of CPU each) on
every run. A rank starts from the server's state, not the caller's: it takes the caller's
environment as it is when ``run_distributed`` is called before it unpickles ``fn`` and
its arguments (so their modules are imported under it, except a ``__main__`` script's,
which multiprocessing re-imports before) and re-reads ``TORCH_DISTRIBUTED_DEBUG``; what
torch reads only at its import (``TORCH_LOGS``, OpenMP variables; with :func:`preload`,
what the modules preloaded read at theirs) and the standard streams are the server's,
from its start.
"""

from __future__ import annotations

import importlib.util
import io
import os
import pickle
import queue
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commpress.cluster.rank import run_rank
from commpress.cluster.system import (
    DistributedError,
    DistributedTimeoutError,
    deferred_signals,
    end_with,
    enter_namespace,
)
from commpress.units import check_seconds

POLL_SECONDS = 0.5
#: How long a rank's failure waits for a peer's exit code, to name a peer that died first.
DEATH_LOOK_SECONDS = 0.5
#: How long the ranks of a run have, together, to end on their own (flushing their output)
#: once it has succeeded, or failed; after a Ctrl-C or SIGTERM they are killed at once
END_GRACE_SECONDS = 5.0
FAILED_GRACE_SECONDS = 1.0
#: How long a rank that has reported stays in its group for the others to report: long
#: enough for a peer to finish opening a group with it, short enough that a peer still in
#: a collective with it learns of its end ("Connection closed") well before the timeout.
HOLD_SECONDS = 5.0
#: what the fork server imports once for every rank it forks (:func:`preload` adds to it)
PRELOADED_MODULES = ["torch.distributed", "commpress.collectives", "commpress.lowrank"]
#: what every rank of an FSDP2 run imports: about two seconds of CPU each (torch's FSDP2
#: pulls in sympy, and its first sharding torch._dynamo)
FSDP_MODULES = ("commpress.integrations.fsdp", "torch._dynamo")


_server_started = False  # the first run starts the fork server, with PRELOADED_MODULES


def preload(*modules: str) -> bool:
    """Have the fork server also import ``modules``, once for every rank it forks: for a
    caller whose ranks all import them. Whether the server will: not once it runs (from the
    first run of this process on), when nothing changes. It imports them with the
    environment of its start, so what they read at their import is read then, once for
    every later run (``torch._dynamo``: ``TORCHDYNAMO_*``, ``TORCH_COMPILE_DISABLE``,
    ``TORCHINDUCTOR_*``)."""
    for name in modules:
        if not isinstance(name, str):
            raise TypeError(f"preload: modules are module names, got {name!r}")
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its parent package is not there
            found = False
        if not found:
            raise ValueError(f"preload: no module named {name!r}")
    if _server_started:
        return False
    PRELOADED_MODULES.extend(name for name in modules if name not in PRELOADED_MODULES)
    return True


def _worker(call, rank, world_size, init_method, backend, timeout, parent, env, namespace, caller):
    # a terminal's Ctrl-C reaches the whole process group: the caller ends the ranks
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    results, release = parent  # the run's reports, and the word that the run is decided
    reported = False
    os.environ.clear()
    os.environ.update(env)
    try:
        if env.get("PYTHONUNBUFFERED"):  # read at an interpreter's start: the server's
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.reconfigure(line_buffering=True, write_through=True)
        if namespace is not None:
            enter_namespace(namespace)  # before any thread starts
        end_with(caller)  # no rank outlives the caller, even one killed (SIGKILL)
        dist.set_debug_level_from_env()  # a bad value is reported like any other error
        torch.set_num_threads(1)
        fn, args = pickle.loads(call)

        def report_and_wait(value: bytes) -> None:
            nonlocal reported
            results.put((rank, True, value))
            reported = True
            release.wait(min(timeout, HOLD_SECONDS))  # until every rank has reported

        run_rank(fn, args, rank, world_size, backend=backend, init_method=init_method,
                 timeout=timeout, leave=report_and_wait)  # fmt: skip
    except BaseException:  # report everything, including KeyboardInterrupt, to the parent
        if reported:  # leaving the group failed after the value: not the run's failure
            print(f"rank {rank}, after its result:\n{traceback.format_exc()}", file=sys.stderr)
        else:
            results.put((rank, False, traceback.format_exc()))


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 120.0,
    allow_dead: bool = False,
) -> list[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` processes; results by rank.

    ``fn`` must be importable (a module-level function) and return picklable values;
    ``args`` travel by plain pickle (tensors, not multiprocessing queues or locks).
    With ``allow_dead``, a rank that dies without reporting yields None (for tests of
    what the others do when a peer crashes) instead of failing the run.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    environments = [dict(os.environ)] * world_size
    return run_ranks(fn, args, environments, backend=backend, timeout=timeout,
                     allow_dead=allow_dead)  # fmt: skip


def run_ranks(
    fn: Callable[..., Any],
    args: tuple,
    environments: list[dict[str, str]],
    *,
    namespaces: list[str] | None = None,
    backend: str = "gloo",
    timeout: float = 120.0,
    allow_dead: bool = False,
) -> list[Any]:
    """:func:`run_distributed` with rank ``r`` running under ``environments[r]`` and, given
    ``namespaces``, in the network namespace ``namespaces[r]``
    (:func:`~commpress.cluster.system.enter_namespace`: the emulated cluster's hosts). The
    ranks meet through a file store in a scratch folder, which every namespace sees."""
    global _server_started
    check_seconds(timeout)
    _check_importable(fn)
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED_MODULES)  # no effect once the server runs
    _server_started = True
    results = context.Queue()
    release = context.Event()  # set once the run is decided: the ranks may leave
    parent = (results, release)
    # plain bytes, unpickled in the rank once it has the caller's environment (and no file
    # descriptor per tensor, of which a fork server passes at most a few hundred)
    call = pickle.dumps((fn, args))
    world_size = len(environments)
    places = namespaces or [None] * world_size
    caller = os.getpid()
    # a Ctrl-C or SIGTERM ends every rank before it raises KeyboardInterrupt here
    scratch_folder = tempfile.TemporaryDirectory(prefix="commpress-dist-")
    with deferred_signals() as stop, scratch_folder as scratch:
        store = f"file://{os.path.join(scratch, 'store')}"
        processes = [
            context.Process(
                target=_worker,
                args=(call, rank, world_size, store, backend, timeout, parent, env, place, caller),
                # not daemonic, so that a rank may start processes of its own (a DataLoader's
                # workers); every rank still ends with this call or with its caller
                daemon=False,
            )
            for rank, (env, place) in enumerate(zip(environments, places, strict=True))
        ]
        try:
            for rank, process in enumerate(processes):
                try:
                    process.start()
                except Exception as error:  # the fork server failed (a preload that raised)
                    raise DistributedError(f"could not start rank {rank}: {error!r}") from error
            values = _collect(processes, results, timeout, allow_dead, stop)
        except BaseException as error:  # a rank failed, a timeout, a signal
            release.set()
            grace = 0.0 if isinstance(error, KeyboardInterrupt) else FAILED_GRACE_SECONDS
            _end([process for process in processes if process.pid is not None], grace)
            raise
        release.set()
        _end(processes, grace=END_GRACE_SECONDS)
        return values


def _check_importable(fn) -> None:
    """A rank finds ``fn`` by its module's name: a function of an interactive session
    has none it could import."""
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not hasattr(main, "__file__"):
        raise ValueError(
            f"fn={getattr(fn, '__qualname__', fn)!r} is defined in an interactive session, "
            "which the ranks cannot import: define it in a module or a script"
        )


def _end(processes, grace: float) -> None:
    """Every rank ended: those still running after ``grace`` seconds in all are killed."""
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=END_GRACE_SECONDS)


def _timed_out(processes, values, timeout: float, report: str = "") -> DistributedTimeoutError:
    """The run outlived ``timeout``; ``report``, a rank's failure that came after it (a
    collective timing out with the run's timeout, which is the process group's too)."""
    missing = sorted(set(range(len(processes))) - set(values))
    return DistributedTimeoutError(f"ranks {missing} did not finish within {timeout} s{report}")


def _collect(processes, results, timeout: float, allow_dead: bool, stop=()) -> list[Any]:
    values: dict[int, Any] = {}
    dead: set[int] = set()
    suspects: set[int] = set()  # ended unreported at the last empty poll
    deadline = time.monotonic() + timeout
    while len(values) + len(dead) < len(processes):
        if stop:  # before any rank's report: theirs may be of the same signal
            raise KeyboardInterrupt(f"signal {stop[0]}: every rank is being ended")
        try:
            rank, ok, value = results.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise _timed_out(processes, values, timeout) from None
            ended = _ended_unreported(processes, values, dead)
            for rank, what in ended:
                # a rank may report and end between the poll and this look: its report is
                # in the queue's pipe by then (flushed before a process ends), so it is
                # judged at the next empty poll
                if rank not in suspects:
                    continue
                if not allow_dead:
                    raise DistributedError(what) from None
                dead.add(rank)
            suspects = {rank for rank, _ in ended}
            continue
        if not ok:  # the cause may be a rank that died first: named ahead of this report
            killed = _ended_unreported(processes, values, dead, rank, failed_only=True)
            if not killed and time.monotonic() > deadline:  # collectives have the run's timeout
                raise _timed_out(processes, values, timeout, f"; rank {rank} failed:\n{value}")
            look_until = time.monotonic() + DEATH_LOOK_SECONDS  # its exit code may lag
            while not killed and time.monotonic() < look_until:
                time.sleep(POLL_SECONDS / 10)
                killed = _ended_unreported(processes, values, dead, rank, failed_only=True)
            raise DistributedError("".join(f"{what}; " for _, what in killed) +
                                   f"rank {rank} failed:\n{value}")  # fmt: skip
        values[rank] = torch.load(io.BytesIO(value), weights_only=False)
    return [values.get(rank) for rank in range(len(processes))]


def _ended_unreported(
    processes, values, dead, failed=None, failed_only=False
) -> list[tuple[int, str]]:
    """``(rank, what happened)`` of each rank that has ended without a report read from the
    queue (but ``failed``, whose report is a failure): killed, failed to start, or ended
    with exit code 0 without reporting (``failed_only``: not those, whose report may still
    be in the queue)."""
    ended = []
    for rank, process in enumerate(processes):
        code = process.exitcode
        if rank in values or rank in dead or rank == failed or code is None:
            continue
        if code != 0:
            ended.append((rank, f"rank {rank} died with exit code {code}"))
        elif not failed_only:
            ended.append((rank, f"rank {rank} ended (exit code 0) without reporting a result"))
    return ended
