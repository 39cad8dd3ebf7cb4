"""Run a command as a multi-node job on an emulated cluster, torchrun's way.

Every rank is its own process inside its host's namespace, with the environment
``torchrun`` gives its workers (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``...), so ``init_process_group(init_method="env://")`` connects
across the emulated links. Output is streamed line by line with a
``h<host>r<rank>|`` prefix. When one rank fails, the others are stopped (they
would wait for it forever); on a timeout, SIGINT or SIGTERM every rank is stopped.
Signals are noted and acted on between steps, never by an exception raised in the
middle of one (a ``Popen`` that would leave a rank untracked, a ``poll`` that would
leave its lock taken, a cleanup cut short). Once the reader of the output has gone
(``commpress launch ... | head``), the ranks' output is still read, and discarded, so
that the job runs to its end; then BrokenPipeError is raised.

Once the ranks have ended, what they left running is killed, also on a cluster that stays
up: every process inside the cluster's hosts whose environment holds the job's own
:data:`JOB_VARIABLE` (each rank is given it, and whatever it starts inherits it), a
detached one (``setsid``, a daemon) too; another job's processes on the same hosts are left
alone. A process that dropped the variable (``env -i``) or left its host's network
namespace is not found: ``commpress cluster down`` removes everything.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from commpress.cluster import system
from commpress.units import check_seconds

STOP_GRACE_SECONDS = 5.0
STREAM_DRAIN_SECONDS = 2.0
POLL_SECONDS = 0.1
TIMEOUT_EXIT_CODE = 124
#: A shell's exit statuses for a command it found but cannot run, and one it cannot find.
NOT_EXECUTABLE_EXIT_CODE, NOT_FOUND_EXIT_CODE = 126, 127
DEFAULT_PORT = 29500
#: Set to a value of its own for each job in every rank's environment: what the launcher
#: finds the job's leftover processes by.
JOB_VARIABLE = "COMMPRESS_JOB"


@dataclass
class Rank:
    host: int
    local_rank: int
    rank: int
    process: subprocess.Popen

    @property
    def label(self) -> str:
        return f"h{self.host}r{self.rank}"


def rank_environment(cluster, host: int, local_rank: int, nproc_per_host: int, port: int) -> dict:
    """The variables torchrun would give local rank ``local_rank`` of host ``host``.

    ``RANK`` follows the host index (``host * nproc_per_host + local_rank``), and hosts are
    numbered rack by rack: ranks are too, so a ring over ranks 0..N-1 leaves each rack once
    and enters it once, crossing every uplink exactly once in each direction.
    """
    world_size = cluster.hosts * nproc_per_host
    return {
        "RANK": str(host * nproc_per_host + local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(nproc_per_host),
        "GROUP_RANK": str(host),
        "NODE_RANK": str(host),
        "MASTER_ADDR": cluster.addresses[0],
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": cluster.layout.interface,
        "PYTHONUNBUFFERED": "1",
    }


def exit_status(returncode: int) -> int:
    """A shell's view of a return code: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def launch(
    cluster,
    command: Sequence[str],
    *,
    nproc_per_host: int = 1,
    port: int = DEFAULT_PORT,
    timeout: float | None = None,
    env: dict | None = None,
    output: TextIO | None = None,
) -> int:
    """Run ``command`` on every host, ``nproc_per_host`` ranks each; the worst exit status.

    ``timeout`` (seconds) stops every rank and returns 124. A command that cannot be found
    returns 127 and one that cannot be run 126, as a shell does, before any rank starts.
    ``env`` adds variables.
    The ranks' lines go to ``output`` (standard output); the launcher's own word on the
    job (a rank that failed, a timeout, a command that cannot run) to standard error.
    Where ``output``'s reader went away, a job that succeeded raises BrokenPipeError once
    it has ended; one that failed returns its status.
    """
    command = list(command)
    if not command or not all(isinstance(part, str) for part in command):
        raise ValueError(f"command must be a non-empty list of strings, got {command!r}")
    if isinstance(nproc_per_host, bool) or not isinstance(nproc_per_host, int):
        raise TypeError(f"nproc_per_host must be an int, got {nproc_per_host!r}")
    if nproc_per_host < 1:
        raise ValueError(f"nproc_per_host must be at least 1, got {nproc_per_host}")
    _check_port(port)
    _check_environment(env)
    if timeout is not None:
        check_seconds(timeout)
    lines = _Lines(output or sys.stdout)
    refused = unrunnable(command[0], {**os.environ, **(env or {})}.get("PATH", os.defpath))
    if refused:
        status, reason = refused
        lines.note(f"commpress launch: {command[0]}: {reason}\n")
        return status
    job = {JOB_VARIABLE: uuid.uuid4().hex}
    ranks: list[Rank] = []
    with system.deferred_signals() as received:  # raises KeyboardInterrupt once all is stopped
        try:
            for host, local_rank in itertools.product(range(cluster.hosts), range(nproc_per_host)):
                if received:
                    break
                ranks.append(
                    _start(cluster, command, host, local_rank, nproc_per_host, port, env, job)
                )
            streams = _stream(ranks, lines)
            status = _supervise(ranks, timeout, lines, received)
        finally:
            _stop(ranks)
            system.kill_marked(f"{JOB_VARIABLE}={job[JOB_VARIABLE]}", cluster.namespaces)
        drained = time.monotonic() + STREAM_DRAIN_SECONDS
        for stream in streams:  # a detached grandchild may hold a pipe open: do not wait on it
            stream.join(timeout=max(0.0, drained - time.monotonic()))
    if lines.reader_gone and status == 0:
        raise BrokenPipeError(errno.EPIPE, "the reader of the job's output has gone")
    return status


def unrunnable(program: str, path: str) -> tuple[int, str] | None:
    """A shell's exit status and its reason where ``program`` cannot be run with the search
    path ``path`` (every host sees this machine's files); None where it can. Each rank's
    ``ip netns exec`` would otherwise fail alone, with iproute2's exit status 1."""
    if shutil.which(program, path=path):
        return None
    if os.sep not in program:
        return NOT_FOUND_EXIT_CODE, "command not found"
    if os.path.isdir(program):
        return NOT_EXECUTABLE_EXIT_CODE, "is a directory"
    if os.path.exists(program):
        return NOT_EXECUTABLE_EXIT_CODE, "permission denied (not executable)"
    return NOT_FOUND_EXIT_CODE, "no such file"


def _check_port(port) -> None:
    """``port`` is the rendezvous port every rank is given as ``MASTER_PORT``."""
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"port must be an int, got {port!r}")
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be between 1 and 65535, got {port}")


def _check_environment(env) -> None:
    """``env``'s names and values are strings, as a process's environment holds."""
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"env must map str to str, got {name!r}: {value!r}")


class _Lines:
    """Whole lines to ``output``, one writer at a time; discarded once its reader has gone."""

    def __init__(self, output: TextIO) -> None:
        self.output = output
        self.lock = threading.Lock()
        self.reader_gone = False

    def write(self, line: str) -> None:
        with self.lock:
            if self.reader_gone:
                return
            try:
                self.output.write(line)
                self.output.flush()
            except BrokenPipeError:
                self.reader_gone = True

    def note(self, text: str) -> None:
        """The launcher's own word, not the job's output: to standard error, as a shell's
        (``commpress launch ... > out.txt`` keeps the job's lines only)."""
        with self.lock:
            sys.stderr.write(text)
            sys.stderr.flush()


def _start(cluster, command, host, local_rank, nproc_per_host, port, env, job) -> Rank:
    variables = {**os.environ, **(env or {})}
    variables.update(rank_environment(cluster, host, local_rank, nproc_per_host, port), **job)
    process = subprocess.Popen(
        ["ip", "netns", "exec", cluster.namespaces[host], *command],
        env=variables,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's Ctrl-C reaches us only; we stop the ranks
    )
    return Rank(host, local_rank, int(variables["RANK"]), process)


def _stream(ranks: list[Rank], lines: _Lines) -> list[threading.Thread]:
    def copy(rank: Rank) -> None:
        for raw in rank.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            lines.write(f"{rank.label}| {line}\n")

    threads = [threading.Thread(target=copy, args=(rank,), daemon=True) for rank in ranks]
    for thread in threads:
        thread.start()
    return threads


def _supervise(ranks: list[Rank], timeout: float | None, lines: _Lines, received: list[int]) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if received:
            name = signal.Signals(received[0]).name
            lines.note(f"commpress launch: {name}; stopping every rank\n")
            return 128 + received[0]
        codes = [rank.process.poll() for rank in ranks]
        failed = [r for r, code in zip(ranks, codes, strict=True) if code not in (None, 0)]
        if failed:
            worst = max(exit_status(rank.process.returncode) for rank in failed)
            labels = ", ".join(rank.label for rank in failed)
            lines.note(f"commpress launch: {labels} exited with {worst}; stopping the others\n")
            return worst
        if all(code == 0 for code in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            lines.note(f"commpress launch: timed out after {timeout:g} s; stopping every rank\n")
            return TIMEOUT_EXIT_CODE
        time.sleep(POLL_SECONDS)


def _stop(ranks: list[Rank]) -> None:
    """SIGTERM each rank's process group, SIGKILL what is left after a grace period."""
    _signal_all(ranks, signal.SIGTERM)
    _wait_all(ranks, STOP_GRACE_SECONDS)
    _signal_all(ranks, signal.SIGKILL)
    _wait_all(ranks, STOP_GRACE_SECONDS)  # not forever: a rank stuck in the kernel is left


def _wait_all(ranks: list[Rank], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for rank in ranks:
        with contextlib.suppress(subprocess.TimeoutExpired):
            rank.process.wait(timeout=max(0.0, deadline - time.monotonic()))


def _signal_all(ranks: list[Rank], signum: int) -> None:
    for rank in ranks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rank.process.pid, signum)
