"""``commpress launch``: a real multi-node job, and nothing left behind when it goes wrong."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commpress.cluster import ClusterError, Emulated, Layout, present, system
from commpress.cluster import launcher as launching

LAUNCH = [sys.executable, "-m", "commpress.cli", "launch"]
IGNORING_SIGINT = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]  # what runs after it inherits that

ALL_REDUCE_SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} local {os.environ['LOCAL_RANK']} sum {value.item():g}")
dist.destroy_process_group()
"""  # noqa: E501

# Records its pid (and a detached grandchild's), then behaves as argv[2] says.
STUBBORN_SCRIPT = """
import os, subprocess, sys, time
folder, behaviour = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
child = subprocess.Popen(["sleep", "300"], start_new_session=True)  # outside our process group
open(os.path.join(folder, f"{rank}.pids"), "w").write(f"{os.getpid()} {child.pid}")
if behaviour == "crash" and rank == "1":
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(folder, "0.pids")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the test reads every rank's pids once the job has ended
    time.sleep(0.5)
    sys.exit(3)
time.sleep(300)
"""


def run_launch(*arguments, timeout=120):
    return subprocess.run(
        [*LAUNCH, *arguments], capture_output=True, text=True, timeout=timeout, check=False
    )


def cli(*arguments, prefix):
    return subprocess.run(
        [sys.executable, "-m", "commpress.cli", *arguments, "--prefix", prefix],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def recorded_pids(folder: Path, ranks: int, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("*.pids"))) < ranks:
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    time.sleep(0.2)  # let the last file be written completely
    return [int(pid) for path in folder.glob("*.pids") for pid in path.read_text().split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_nothing_left(prefix: str, pids: list[int]) -> None:
    assert present(Layout(prefix)) == []
    assert [pid for pid in pids if alive(pid)] == []


def test_a_multi_node_job_with_two_ranks_per_host(prefix):
    done = run_launch(
        "--hosts",
        "2",
        "--link",
        "1gbit",
        "--prefix",
        prefix,
        "--nproc-per-host",
        "2",
        "--",
        sys.executable,
        "-c",
        ALL_REDUCE_SCRIPT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cannot be retrieved" not in done.stdout + done.stderr  # c10d's reverse lookup
    lines = sorted(line for line in done.stdout.splitlines() if "sum" in line)
    assert lines == [
        "h0r0| rank 0/4 local 0 sum 10",
        "h0r1| rank 1/4 local 1 sum 10",
        "h1r2| rank 2/4 local 0 sum 10",
        "h1r3| rank 3/4 local 1 sum 10",
    ]
    assert present(Layout(prefix)) == []


def test_a_crashed_rank_stops_the_job_with_its_exit_code(prefix, tmp_path):
    done = run_launch(
        "--hosts",
        "2",
        "--link",
        "100mbit",
        "--prefix",
        prefix,
        "--",
        sys.executable,
        "-c",
        STUBBORN_SCRIPT,
        str(tmp_path),
        "crash",
    )
    assert done.returncode == 3
    assert "h1r1 exited with 3" in done.stderr and "exited with" not in done.stdout
    assert_nothing_left(prefix, recorded_pids(tmp_path, 2, timeout=0))


@pytest.mark.parametrize(
    ("program", "status", "reason"),
    [
        ("commpress-no-such-command", 127, "command not found"),
        ("./no-such-script.sh", 127, "no such file"),
        ("{tmp}/plain.txt", 126, "permission denied (not executable)"),
        ("{tmp}", 126, "is a directory"),
    ],
)
def test_a_command_that_cannot_run_is_a_shells_status_naming_it(
    prefix, program, status, reason, tmp_path
):
    """Each rank's `ip netns exec` failed on its own, and the job exited with iproute2's 1
    where a shell gives 127 (not found) or 126 (not executable)."""
    (tmp_path / "plain.txt").write_text("echo not run\n")
    program = program.format(tmp=tmp_path)
    done = run_launch("--hosts", "2", "--link", "1gbit", "--prefix", prefix, "--", program)
    assert done.returncode == status, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.endswith(f"commpress launch: {program}: {reason}\n")
    assert present(Layout(prefix)) == []


def _launch_and_stop_reading(prefix: str, script: str) -> tuple[int, str]:
    """`commpress launch ... | head -1` of ``script`` on 2 hosts: its exit status and
    standard error."""
    launcher = subprocess.Popen(
        [*LAUNCH, "--hosts", "2", "--link", "100mbit", "--prefix", prefix, "--timeout", "20",
         "--", "sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        launcher.stdout.readline()
        launcher.stdout.close()
        _, stderr = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    return launcher.returncode, stderr


def test_a_reader_that_goes_away_lets_the_job_run_to_its_end(prefix, tmp_path):
    # more output than a pipe holds, then a file at the end
    status, stderr = _launch_and_stop_reading(prefix, f"seq 1 100000; touch {tmp_path}/$RANK.done")
    assert status == 141, stderr
    assert "Traceback" not in stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["0.done", "1.done"]
    assert present(Layout(prefix)) == []


def test_a_job_that_fails_after_its_reader_went_away_keeps_its_status(prefix):
    """It was reported as 141 (SIGPIPE), whatever the ranks' status: a failed job looked
    like a pipeline cut short, and the launcher's word on it was discarded."""
    status, stderr = _launch_and_stop_reading(prefix, "seq 1 100000; exit 3")
    assert status == 3, stderr
    assert "exited with 3; stopping the others" in stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert present(Layout(prefix)) == []


def test_a_timeout_stops_every_rank(prefix, tmp_path):
    done = run_launch(
        "--hosts",
        "2",
        "--link",
        "100mbit",
        "--prefix",
        prefix,
        "--timeout",
        "3",
        "--",
        sys.executable,
        "-c",
        STUBBORN_SCRIPT,
        str(tmp_path),
        "hang",
    )
    assert done.returncode == 124
    assert "timed out after 3 s" in done.stderr
    assert_nothing_left(prefix, recorded_pids(tmp_path, 2, timeout=0))


def test_ctrl_c_stops_the_job_and_removes_the_cluster(prefix, tmp_path):
    # Started with SIGINT ignored, as a script's background job (or a CI runner) starts it:
    # Python then never raises KeyboardInterrupt unless the launcher handles SIGINT itself.
    launcher = subprocess.Popen(
        [
            *IGNORING_SIGINT,
            *LAUNCH,
            "--hosts",
            "3",
            "--link",
            "100mbit",
            "--prefix",
            prefix,
            "--",
            sys.executable,
            "-c",
            STUBBORN_SCRIPT,
            str(tmp_path),
            "hang",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = recorded_pids(tmp_path, 3)
        assert present(Layout(prefix))
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, stderr
    assert_nothing_left(prefix, pids)


def test_ctrl_c_while_the_ranks_start_stops_those_already_started(prefix, monkeypatch):
    started = []

    def start_then_interrupt(*arguments):
        started.append(real_start(*arguments))
        os.kill(os.getpid(), signal.SIGINT)  # between two Popen calls
        return started[-1]

    real_start = launching._start
    monkeypatch.setattr(launching, "_start", start_then_interrupt)
    with Emulated(2, "100mbit", prefix=prefix) as cluster, pytest.raises(KeyboardInterrupt):
        cluster.launch(["sleep", "300"], nproc_per_host=2, output=io.StringIO())
    assert len(started) == 1 and started[0].process.returncode is not None


def test_a_cluster_that_is_up_is_used_and_kept(prefix):
    with Emulated(2, "100mbit", prefix=prefix):
        done = run_launch("--prefix", prefix, "--", "sh", "-c", "echo $MASTER_ADDR $WORLD_SIZE")
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.splitlines()) == ["h0r0| 10.213.0.1 2", "h1r1| 10.213.0.1 2"]
        assert present(Layout(prefix))
        wrong = run_launch("--prefix", prefix, "--hosts", "3", "--", "true")
        assert wrong.returncode == 1 and "up with 2 hosts" in wrong.stderr


def test_on_a_kept_cluster_the_job_s_detached_processes_end_with_it_another_job_s_stay(
    prefix, tmp_path
):
    """Before, a rank's `setsid` grandchild outlived its job on a cluster that stays up
    (only a cluster the launcher built was cleared, by removing it)."""
    with Emulated(2, "100mbit", prefix=prefix) as cluster:
        other = subprocess.Popen(
            ["ip", "netns", "exec", cluster.namespaces[0], "sleep", "300"],
            env={**os.environ, "COMMPRESS_JOB": "another"},  # what the launcher marks its jobs by
        )
        try:
            detach = f"setsid sleep 300 >/dev/null 2>&1 & echo $! > {tmp_path}/$RANK.pids"
            assert cluster.launch(["sh", "-c", detach], output=io.StringIO()) == 0
            left = recorded_pids(tmp_path, 2, timeout=0)
            assert len(left) == 2 and not [pid for pid in left if alive(pid)]
            assert alive(other.pid)
        finally:
            other.kill()
            other.wait()


def test_launch_without_a_cluster_fails_and_without_a_command_is_a_usage_error(prefix):
    no_cluster = run_launch("--prefix", prefix, "--", "true")
    assert no_cluster.returncode == 1 and "give both --hosts and --link" in no_cluster.stderr
    missing = run_launch("--hosts", "2", "--link", "1gbit", "--prefix", prefix)
    assert missing.returncode == 2 and "give the command to run" in missing.stderr
    assert present(Layout(prefix)) == []
    assert os.geteuid() == 0


def test_cluster_up_status_down_from_the_command_line(prefix):
    def cli(*arguments):
        return subprocess.run(
            [sys.executable, "-m", "commpress.cli", "cluster", *arguments, "--prefix", prefix],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    up = cli("up", "--hosts", "3", "--link", "200mbit", "--mtu", "9000")
    assert up.returncode == 0, up.stderr
    assert "3 hosts, links 200mbit, mtu 9000" in up.stdout
    status = cli("status")
    assert "cluster: 3 hosts, links 200mbit, mtu 9000" in status.stdout
    assert f"{prefix}-h2" in status.stdout and "10.213.0.3" in status.stdout
    again = cli("up", "--hosts", "3", "--link", "200mbit")
    assert again.returncode == 1 and "already exists" in again.stderr
    down = cli("down")
    assert down.returncode == 0 and f"{prefix}-br" in down.stdout
    assert "nothing to remove" in cli("down").stdout
    gone = cli("status")  # exit status 0 once, as if it were up
    assert gone.returncode == 1 and gone.stdout == ""
    assert f"no cluster named '{prefix}' is up" in gone.stderr


@pytest.mark.parametrize("removed", [["namespace"], ["namespace", "folder"]])
def test_a_cluster_whose_last_host_was_removed_by_hand_is_incomplete_not_smaller(prefix, removed):
    """Before, after `ip netns del <prefix>-h2` the cluster attached as a whole one of two
    hosts: what was left of its third (a folder in /etc/netns, its name in every other
    host's hosts file) was not counted."""
    Emulated(3, "100mbit", prefix=prefix).up()
    system.ip("netns", "del", f"{prefix}-h2")
    if "folder" in removed:
        shutil.rmtree(f"/etc/netns/{prefix}-h2")
    incomplete = f"incomplete \\(missing: {prefix}-h2\\b.*cluster down --prefix {prefix}"
    with pytest.raises(ClusterError, match=incomplete):
        Emulated.attach(prefix)
    for done in (cli("cluster", "status", prefix=prefix), run_launch("--prefix", prefix, "true")):
        assert done.returncode == 1 and re.search(incomplete, done.stderr), done.stderr
    down = cli("cluster", "down", prefix=prefix)
    assert down.returncode == 0 and f"{prefix}-h0" in down.stdout, down.stderr
    assert present(Layout(prefix)) == []


@pytest.mark.parametrize("port", ["29500", 0, 65536, True])
def test_a_bad_port_is_refused_before_any_rank_starts(port):
    """It was passed on as every rank's MASTER_PORT, to fail (or hang) at the rendezvous."""
    nowhere = type("NoHosts", (), {"hosts": 0})()
    with pytest.raises((TypeError, ValueError), match="port must be"):
        launching.launch(nowhere, ["true"], port=port, output=io.StringIO())


@pytest.mark.parametrize("env", [{"STEPS": 10}, {1: "x"}])
def test_an_environment_variable_that_is_no_string_is_named(env):
    """Popen's "expected str, bytes or os.PathLike object, not int" named neither."""
    nowhere = type("NoHosts", (), {"hosts": 0})()
    with pytest.raises(TypeError, match=f"env must map str to str, got {next(iter(env))!r}"):
        launching.launch(nowhere, ["true"], env=env, output=io.StringIO())
