"""``run_distributed``: ranks forked from a preloaded server, each with the caller's environment."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist
from tests.conftest import PRELOADED_FOR_THE_TESTS

from commpress.cluster import local
from commpress.cluster.jobs import run_on_cluster
from commpress.cluster.layout import Layout
from commpress.cluster.local import (
    FSDP_MODULES,
    PRELOADED_MODULES,
    DistributedError,
    run_distributed,
)
from commpress.cluster.system import DistributedTimeoutError

VARIABLE = "COMMPRESS_TEST_RUNNER_VARIABLE"


def _seen(rank, world_size):
    return (
        os.environ.get(VARIABLE),
        str(dist.get_debug_level()),
        sorted(set(PRELOADED_MODULES) - set(sys.modules)),
        torch.cuda.is_initialized(),
    )


def _not_yet_imported(rank, world_size, names):
    return [name for name in names if name not in sys.modules]


def test_what_is_preloaded_is_imported_before_a_rank_runs():
    """tests/conftest.py has the server import FSDP2 and torch._dynamo (about two seconds of
    CPU that every rank of an FSDP run paid), pytest and torch.distributed.checkpoint."""
    assert run_distributed(_not_yet_imported, 2, PRELOADED_FOR_THE_TESTS) == [[], []]
    if not torch.cuda.is_available():
        assert set(FSDP_MODULES) <= set(PRELOADED_FOR_THE_TESTS)


def test_preload_takes_module_names_and_nothing_once_the_server_runs():
    run_distributed(_not_yet_imported, 2, [])  # the server runs from here on
    with pytest.raises(TypeError, match="module names, got 123"):
        local.preload(123)
    with pytest.raises(ValueError, match="no module named 'commpress.no_such_module'"):
        local.preload("commpress.no_such_module")
    with pytest.raises(ValueError, match="no module named 'no_such_package.module'"):
        local.preload("no_such_package.module")
    before = list(PRELOADED_MODULES)
    assert local.preload("json") is False
    assert before == PRELOADED_MODULES  # not listed: the server will not import it


def test_each_rank_sees_the_environment_of_the_call_not_of_the_servers_start(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    off = (None, "DebugLevel.OFF", [], False)
    assert run_distributed(_seen, 2) == [off] * 2  # the server runs from here on
    monkeypatch.setenv(VARIABLE, "set after the server started")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    seen = ("set after the server started", "DebugLevel.DETAIL", [], False)
    assert run_distributed(_seen, 2) == [seen] * 2
    monkeypatch.delenv(VARIABLE)
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG")
    assert run_distributed(_seen, 2) == [off] * 2


SERVER_STARTED_WITH_THE_VARIABLE = f"""
import os
from commpress.cluster.local import run_distributed

def seen(rank, world_size):
    return os.environ.get({VARIABLE!r})

if __name__ == "__main__":
    os.environ[{VARIABLE!r}] = "there when the server started"
    assert run_distributed(seen, 2) == ["there when the server started"] * 2
    del os.environ[{VARIABLE!r}]
    assert run_distributed(seen, 2) == [None] * 2, "a variable removed since the start"
"""


def test_a_variable_removed_after_the_server_started_is_gone_in_the_ranks(tmp_path):
    script = tmp_path / "removed.py"
    script.write_text(textwrap.dedent(SERVER_STARTED_WITH_THE_VARIABLE))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr


def _fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("rank one refuses")
    return rank


def test_a_rank_that_raises_fails_the_run_with_its_traceback():
    with pytest.raises(DistributedError, match="(?s)rank 1 failed.*rank one refuses"):
        run_distributed(_fail_on_rank_one, 2, timeout=60)


def _exit_on_rank_one(rank, world_size, code=3):
    if rank == 1:
        os._exit(code)
    return rank


def test_a_rank_that_dies_fails_the_run_with_its_exit_code():
    with pytest.raises(DistributedError, match="rank 1 died with exit code 3"):
        run_distributed(_exit_on_rank_one, 2, timeout=60)
    assert run_distributed(_exit_on_rank_one, 2, timeout=60, allow_dead=True) == [0, None]


def _killed_between_collectives(rank, world_size):
    import signal

    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()  # rank 0 fails here: its peer is gone
    return rank


def test_a_peer_killed_is_named_ahead_of_the_error_it_caused():
    """Only rank 0's "connection closed" was reported, not that rank 1 had been killed."""
    with pytest.raises(DistributedError, match="(?s)rank 1 died with exit code -9.*rank 0"):
        run_distributed(_killed_between_collectives, 2, timeout=60)


def test_a_rank_that_ends_without_a_result_fails_the_run_at_once():
    """It waited out the whole timeout, then said the rank had not finished."""
    started = time.monotonic()
    with pytest.raises(DistributedError, match="rank 1 ended .exit code 0. without reporting"):
        run_distributed(_exit_on_rank_one, 2, 0, timeout=60)
    assert time.monotonic() - started < 30


def _children_of_a_rank(rank, world_size):
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4, num_workers=1)
    return [batch.tolist() for batch in loader]


def test_a_rank_may_start_processes_of_its_own():
    """Ranks were daemonic, which may not have children: a DataLoader with workers failed."""
    assert (
        run_distributed(_children_of_a_rank, 2, timeout=120) == [[[0, 1, 2, 3], [4, 5, 6, 7]]] * 2
    )


def test_tensors_in_the_arguments_reach_every_rank_whatever_their_number():
    tensors = [torch.full((3,), float(i)) for i in range(300)]  # a descriptor each, if shared
    sums = run_distributed(_sum_of, 2, tensors, timeout=60)
    assert sums == [sum(3.0 * i for i in range(300))] * 2


def _sum_of(rank, world_size, tensors):
    return float(sum(t.sum() for t in tensors))


@pytest.mark.parametrize("world_size", [0, -1, True, 2.0])
def test_a_bad_world_size_is_a_value_error(world_size):
    with pytest.raises(ValueError, match="world_size"):
        run_distributed(_seen, world_size)


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        (1e20, ValueError),
        ("60", TypeError),
        (True, TypeError),
    ],
)
def test_a_bad_timeout_names_itself_before_any_rank_starts(timeout, error):
    with pytest.raises(error, match="timeout"):
        run_distributed(_seen, 2, timeout=timeout)


def test_a_function_of_an_interactive_session_is_refused_with_the_reason(monkeypatch):
    import types

    def typed_at_the_prompt(rank, world_size):
        return rank

    typed_at_the_prompt.__module__ = "__main__"
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # no __file__
    with pytest.raises(ValueError, match="interactive session"):
        run_distributed(typed_at_the_prompt, 2)


STOPPED_WHILE_RANKS_RUN = """
import os, sys, time
from commpress.cluster.local import run_distributed

def linger(rank, world_size, folder):
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(120)

if __name__ == "__main__":
    run_distributed(linger, 2, sys.argv[1], timeout=300)
"""


@pytest.mark.parametrize(
    ("signum", "whole_group"),
    [("SIGTERM", False), ("SIGINT", False), ("SIGINT", True), ("SIGKILL", False)],
    ids=["SIGTERM", "SIGINT", "ctrl-c", "SIGKILL"],
)
def test_no_rank_outlives_a_caller_that_is_stopped_or_killed(tmp_path, signum, whole_group):
    """SIGTERM, SIGINT, and a terminal's Ctrl-C (SIGINT to the whole process group, ranks
    included): the caller ends every rank, then raises KeyboardInterrupt, not a rank's
    error, and removes its scratch folders. SIGKILL: the fork server outlives the caller
    while the ranks hold its pipe; each rank, waiting on its caller's pidfd, kills itself
    (the caller's scratch folders stay, under this test's TMPDIR: they were left in /tmp)."""
    import signal
    import time

    script = tmp_path / "stopped.py"
    script.write_text(STOPPED_WHILE_RANKS_RUN)
    folder = tmp_path / "pids"
    folder.mkdir()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    caller = subprocess.Popen(
        [sys.executable, str(script), str(folder)],
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks = [int(name) for name in os.listdir(folder)]
    try:
        assert len(ranks) == 2, "the ranks did not start"
        if whole_group:
            os.killpg(caller.pid, getattr(signal, signum))
        else:
            caller.send_signal(getattr(signal, signum))
        _, stderr = caller.communicate(timeout=30)
        if signum != "SIGKILL":
            assert b"KeyboardInterrupt" in stderr and b"DistributedError" not in stderr, stderr
            assert not os.listdir(scratch)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in ranks)
    finally:
        caller.kill()
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, 9)


ENDS_WITH = """
import os, sys, time
from commpress.cluster.system import end_with
if sys.argv[2] == "without-pidfd":
    del os.pidfd_open  # as on a kernel before 5.3 (RHEL 8's 4.18)
end_with(int(sys.argv[1]), poll_seconds=0.1)
print("watching", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["pidfd", "without-pidfd"])
def test_a_rank_ends_with_its_caller_with_or_without_pidfd(how):
    caller = subprocess.Popen(["sleep", "60"])
    watcher = subprocess.Popen(
        [sys.executable, "-c", ENDS_WITH, str(caller.pid), how], stdout=subprocess.PIPE
    )
    try:
        assert watcher.stdout.readline() == b"watching\n"
        assert watcher.poll() is None  # its caller still runs
        caller.kill()
        caller.wait()
        assert watcher.wait(timeout=10) == -9
    finally:
        caller.kill()
        watcher.kill()
        caller.wait()
        watcher.wait()


@pytest.mark.parametrize("how", ["pidfd", "without-pidfd"])
def test_a_caller_that_has_ended_already_ends_the_rank_at_once(how):
    """The caller a zombie (ended, not yet reaped: its pid cannot be reused meanwhile)."""
    import time

    gone = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 30
        while _alive(gone.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        watcher = subprocess.run(
            [sys.executable, "-c", ENDS_WITH, str(gone.pid), how], capture_output=True, timeout=30
        )
        assert watcher.returncode == -9 and time.monotonic() - started < 10  # it sleeps 60 s
    finally:
        gone.wait()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which has ended, does not): the tests' own reading
    of ``/proc``, not the one under test."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _first_returns_at_once_second_looks(rank, world_size, folder):
    pid_file = os.path.join(folder, "first")
    if rank == 0:
        with open(pid_file + ".tmp", "w") as file:
            file.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        return None
    while not os.path.exists(pid_file):
        time.sleep(0.01)
    with open(pid_file) as file:
        first = int(file.read())
    time.sleep(1.0)  # as a slower peer still connecting a group made in fn
    return _alive(first)


def test_a_rank_that_finished_first_keeps_its_group_up_until_every_rank_has_reported(tmp_path):
    """A rank that returned first destroyed its group and ended: a peer still in the
    connectFullMesh of a group made in fn failed with "Connection closed by peer" (seen in
    CI, tests/distributed/test_fsdp_groups.py, at stop 42)."""
    assert run_distributed(_first_returns_at_once_second_looks, 2, str(tmp_path), timeout=60) == [
        None,
        True,
    ]


def test_a_rank_leaves_its_value_while_its_group_is_still_up(tmp_path):
    """What the runner's hold relies on: ``leave`` runs before the group is destroyed."""
    from commpress.cluster.rank import run_rank

    seen = []
    run_rank(lambda rank, world_size: rank, (), 0, 1, backend="gloo",
             init_method=f"file://{tmp_path / 'store'}", timeout=30,
             leave=lambda value: seen.append(dist.is_initialized()))  # fmt: skip
    assert seen == [True] and not dist.is_initialized()


def _ends_its_world(rank, world_size):
    dist.destroy_process_group()
    return rank


def test_a_rank_that_destroys_its_world_as_torch_scripts_end_leaves_without_an_error(tmp_path):
    """The rank's own ``destroy_process_group`` after fn's raised torch's "Process group
    cannot be None": a traceback on every rank's stderr, once the run had succeeded."""
    from commpress.cluster.rank import run_rank

    run_rank(_ends_its_world, (), 0, 1, backend="gloo",
             init_method=f"file://{tmp_path / 'store'}", timeout=30)  # fmt: skip
    assert not dist.is_initialized()


def _rank_one_waits_for_rank_zero_which_returned(rank, world_size):
    if rank == 1:
        dist.all_reduce(torch.ones(1))


def test_a_peer_in_a_collective_with_a_rank_that_returned_learns_of_its_end():
    """The hold is bounded: held until the run's timeout, rank 0 kept rank 1 waiting for
    gloo's timeout (60 s here) instead of closing the connection rank 1 waits on."""
    closed = "(?s)rank 1 failed.*Connection (reset|closed) by peer"
    with pytest.raises(DistributedError, match=closed):
        run_distributed(_rank_one_waits_for_rank_zero_which_returned, 2, timeout=60)


class _Running:
    exitcode = None


class _Reports:
    def __init__(self, *reports):
        self.reports = list(reports)

    def get(self, timeout):
        return self.reports.pop(0)


def test_a_failure_reported_after_the_runs_timeout_is_the_runs_timeout():
    """A rank's collective times out with the run's timeout, which its process group has:
    its report, when it came before the caller's next look at the clock, was taken for a
    failed rank, and `commpress bench` exited 1 where `launch` gives 124."""
    from commpress.cluster.local import _collect

    report = (1, False, "RuntimeError: [gloo] Timed out waiting 3000ms")
    with pytest.raises(DistributedTimeoutError, match=r"(?s)ranks \[0, 1\] did not .*Timed out"):
        _collect([_Running(), _Running()], _Reports(report), timeout=0.0, allow_dead=False)
    with pytest.raises(DistributedError, match="rank 1 failed") as raised:  # within it
        _collect([_Running(), _Running()], _Reports(report), timeout=60.0, allow_dead=False)
    assert not isinstance(raised.value, DistributedTimeoutError)
    killed = _Running()
    killed.exitcode = -9  # a peer killed is the cause, past the deadline too: named first
    with pytest.raises(DistributedError, match="rank 0 died with exit code -9; rank 1") as raised:
        _collect([killed, _Running()], _Reports(report), timeout=0.0, allow_dead=False)
    assert not isinstance(raised.value, DistributedTimeoutError)


def _sleeps(rank, world_size):
    time.sleep(60)


class _LocalHosts:
    """What run_on_cluster reads of a cluster, its hosts local processes."""

    hosts, namespaces, addresses = 2, [None, None], ["127.0.0.1"] * 2
    layout = Layout("cpt", interface="lo")  # eth0, a cluster host's, is not every machine's

    def describe(self) -> str:
        return "2 local hosts"


def test_a_job_that_outlives_its_timeout_raises_the_timeouts_own_error():
    """It raised the DistributedError of a failed rank, so `commpress bench` and `train`
    could not tell a timeout (exit status 124, as `launch`) from a failure (1)."""
    with pytest.raises(DistributedTimeoutError, match=r"the job on 2 local hosts: ranks \[0, 1\]"):
        run_on_cluster(_LocalHosts(), _sleeps, timeout=0.5)
