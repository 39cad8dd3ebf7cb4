"""Emulated-cluster configuration without root: rates, names, counters, bad input."""

from __future__ import annotations

import argparse
import io
import math
import os
import queue
import types

import pytest
import torch

from commpress.cluster import Counters, Emulated, Layout, Link, parse_rate, system
from commpress.cluster.commands import add_link_arguments, wants_cluster
from commpress.cluster.counters import parse_net_dev, parse_retransmitted
from commpress.cluster.launcher import exit_status, launch, rank_environment
from commpress.collectives.workspace import Workspace
from commpress.units import parse_rate_bits

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       7       1    0    0    0     0          0         0        7       1    0    0    0     0       0          0
  eth0:     454       5    0    0    0     0          0         0       90       2    0    0    0     0       0          0
"""  # noqa: E501


@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("1gbit", 10**9),
        ("100mbit", 10**8),
        ("2.5gbit", 25 * 10**8),
        (" 10 Mbit ", 10**7),
        ("2.01gbit", 201 * 10**7),  # the float product is 2009999999.9999998
        ("0.1tbit", 10**11),
    ],
)
def test_rates_use_tc_units(text, bits):
    assert parse_rate(text) == bits
    assert parse_rate_bits(text) == bits


@pytest.mark.parametrize("text", ["1.5bit", "0.0005kbit", "0.5bit"])
def test_a_rate_of_a_fraction_of_a_bit_is_refused_not_truncated(text):
    with pytest.raises(ValueError, match="whole number of bits"):
        parse_rate_bits(text, "uplink")


@pytest.mark.parametrize(
    ("rate", "nearest"), [("333333333bit", "333333328bit"), (1_000_004, "1mbit")]
)
def test_a_rate_tc_would_truncate_to_whole_bytes_is_refused(rate, nearest):
    """tc shapes in bytes per second: a cluster built at 333333333bit ran at 333333328,
    which it was read back as, so the same --link on it was refused as a mismatch."""
    with pytest.raises(ValueError, match=f"whole number of bytes per second.*give {nearest}"):
        Link.parse(rate)


@pytest.mark.parametrize(
    "text", ["1gbyte", "fast", "", "gbit", "-1gbit", "1 g bit", "999kbit", "100tbit"]
)
def test_bad_rates_are_value_errors_naming_the_value(text):
    with pytest.raises(ValueError, match="link rate"):
        parse_rate(text)


def test_link_rejects_bad_types_and_mtu():
    with pytest.raises(TypeError, match="link rate"):
        Link.parse(1.5)
    with pytest.raises(ValueError, match="mtu"):
        Link.parse("1gbit", mtu=100)
    with pytest.raises(ValueError, match="delay"):
        Link.parse("1gbit", delay="0ms")
    assert Link.parse("1gbit", delay="200us").delay_s == pytest.approx(2e-4)


@pytest.mark.parametrize(
    ("delay", "netem"), [("15us", "15us"), ("0.043ms", "43us"), ("0.000291s", "291us")]
)
def test_netem_gets_the_delay_given_not_a_microsecond_less(delay, netem, monkeypatch):
    """Before, int() of the float product gave netem 14us for 15us: a third of all values."""
    commands = []
    monkeypatch.setattr(system, "tc", lambda *arguments: commands.append(arguments))
    Emulated(2, "1gbit", delay=delay)._shape("cp-h0", "cp-s0")
    assert commands[-1][-3:] == ("netem", "delay", netem)


@pytest.mark.parametrize("delay", ["0.5us", "1.5us", "0.0001ms"])
def test_a_delay_netem_cannot_take_is_refused_not_truncated(delay):
    with pytest.raises(ValueError, match="whole number of microseconds"):
        Link.parse("1gbit", delay=delay)


def test_a_delay_past_what_tc_takes_is_refused_before_anything_is_built():
    """From a bug hunt: ``cluster up --delay 300s`` built the hosts, then failed (exit 1) at
    tc's 'Illegal 300000000 time (too large)', two lines naming no option."""
    assert Link.parse("1gbit", delay="274s").delay_s == 274
    with pytest.raises(ValueError, match="delay '275s' is above netem's maximum of 274877906us"):
        Link.parse("1gbit", delay="275s")


def test_ideal_time_is_bytes_over_rate():
    assert Link.parse("1gbit").seconds_for(125_000_000) == pytest.approx(1.0)


@pytest.mark.parametrize("hosts", [0, -1, 255])
def test_host_count_out_of_range_is_a_value_error(hosts):
    with pytest.raises(ValueError, match=f"hosts must be between 1 and 254, got {hosts}"):
        Emulated(hosts, "1gbit")


def test_host_count_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="hosts"):
        Emulated("4", "1gbit")


def test_layout_names_fit_linux_interface_names():
    layout = Layout("abcdef")
    assert layout.namespace(253) == "abcdef-h253"
    assert len(layout.switch_port(253)) <= 15 and len(layout.bridge) <= 15
    assert layout.address(0) == "10.213.0.1" and layout.address(253) == "10.213.0.254"
    assert layout.host_of("abcdef-h12") == 12
    assert layout.host_of("abcdef-h12x") is None and layout.host_of("cp-h1") is None


@pytest.mark.parametrize("prefix", ["", "Cp", "1cp", "toolongx", "c p"])
def test_bad_prefix_is_a_value_error(prefix):
    with pytest.raises(ValueError, match="prefix"):
        Layout(prefix)


def test_net_dev_parsing_and_differences():
    counters = parse_net_dev(NET_DEV, "eth0")
    assert counters == Counters(rx_bytes=454, rx_packets=5, tx_bytes=90, tx_packets=2)
    assert counters - parse_net_dev(NET_DEV, "lo") == Counters(447, 4, 83, 1)
    with pytest.raises(ValueError, match="eth1"):
        parse_net_dev(NET_DEV, "eth1")


def test_exit_status_maps_signals_like_a_shell():
    assert exit_status(0) == 0 and exit_status(3) == 3 and exit_status(-9) == 137


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("60", TypeError),
        (True, TypeError),
    ],
)
def test_a_bad_launch_timeout_names_itself_before_anything_starts(timeout, error):
    """NaN and infinity once passed, leaving a deadline that never comes."""
    no_cluster = object()  # read only after the arguments are checked
    with pytest.raises(error, match="timeout"):
        launch(no_cluster, ["true"], timeout=timeout)


def test_the_launchers_word_goes_to_standard_error_not_the_jobs_output(capsys):
    """``commpress launch -- nosuchcmd > out.txt`` wrote 'command not found' into out.txt,
    beside the job's lines, and nothing to the terminal; so did a failed rank's or a
    timeout's note."""
    output = io.StringIO()
    no_cluster = object()  # a command that cannot run is refused before the cluster is used
    assert launch(no_cluster, ["commpress-no-such-command"], output=output) == 127
    assert output.getvalue() == ""
    err = capsys.readouterr().err
    assert err == "commpress launch: commpress-no-such-command: command not found\n"


def test_the_longest_timeout_taken_is_one_every_wait_holds():
    """It was ``timedelta.max``'s, which ``timedelta(seconds=...)`` itself overflows on."""
    from datetime import timedelta

    from commpress.units import MAX_SECONDS, check_seconds

    check_seconds(MAX_SECONDS)
    assert timedelta(seconds=MAX_SECONDS) > timedelta(days=365 * 100)
    with pytest.raises(ValueError, match="timeout"):
        check_seconds(MAX_SECONDS * 2)


def test_workspace_reuses_and_grows():
    workspace = Workspace()
    first = workspace.take("a", 100, torch.float32, "cpu")
    again = workspace.take("a", 50, first.dtype, "cpu")
    assert again.data_ptr() == first.data_ptr() and again.numel() == 50
    bigger = workspace.take("a", 1000, first.dtype, "cpu")
    assert bigger.numel() == 1000 and workspace.held_bytes() >= 4000
    pieces = workspace.take_pieces("b", [3, 5], "cpu")
    assert [p.numel() for p in pieces] == [3, 5]
    assert pieces[1].data_ptr() == pieces[0].data_ptr() + 3
    workspace.release()
    assert workspace.held_bytes() == 0


def test_workspace_grows_for_a_request_one_byte_past_what_it_holds():
    """Buffers are rounded up to whole 64-byte lines: a request of one byte more than the
    rounded buffer (not one more than asked before) gets a larger one, all of it usable."""
    workspace = Workspace()
    workspace.take("a", 100, torch.uint8, "cpu")
    assert workspace.held_bytes() == 128
    assert workspace.take("a", 128, torch.uint8, "cpu").numel() == 128
    grown = workspace.take("a", 129, torch.uint8, "cpu")
    assert grown.numel() == 129 and workspace.held_bytes() == 192
    grown.fill_(1)  # every byte is the buffer's own
    assert workspace.take("a", 65, torch.int16, "cpu").numel() == 65  # 130 bytes fit
    assert workspace.take("a", 97, torch.int16, "cpu").numel() == 97  # 194 do not
    assert workspace.held_bytes() == 256


SNMP = """Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 120
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 12 9 0 1 6 51234 49876 37 0 3 0
Udp: InDatagrams NoPorts InErrors OutDatagrams
Udp: 5 0 0 5
"""  # noqa: E501


def test_retransmitted_segments_are_read_from_the_tcp_line():
    assert parse_retransmitted(SNMP) == 37


# -- racks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hosts", "racks", "message"),
    [
        (4, 3, "racks must divide hosts.*racks=3, hosts=4"),
        (4, 0, "racks must be at least 1, got 0"),
        (4, -2, "racks must be at least 1, got -2"),
        (2, 4, "racks must divide hosts"),
    ],
)
def test_bad_rack_count_is_a_value_error_naming_racks(hosts, racks, message):
    with pytest.raises(ValueError, match=message):
        Emulated(hosts, "1gbit", racks=racks)


@pytest.mark.parametrize("racks", [True, "2", 2.0, None])
def test_rack_count_of_the_wrong_type_is_a_type_error(racks):
    with pytest.raises(TypeError, match="racks must be an int"):
        Emulated(4, "1gbit", racks=racks)


def test_uplink_needs_more_than_one_rack_and_a_good_rate():
    with pytest.raises(ValueError, match="uplink='500mbit' needs racks > 1"):
        Emulated(4, "1gbit", uplink="500mbit")
    with pytest.raises(ValueError, match="uplink='500mbit' needs racks > 1"):
        Emulated(4, "1gbit", racks=1, uplink="500mbit")
    with pytest.raises(ValueError, match="uplink: link rate '1gbyte'"):
        Emulated(4, "1gbit", racks=2, uplink="1gbyte")
    with pytest.raises(TypeError, match="uplink: link rate"):
        Emulated(4, "1gbit", racks=2, uplink=1.5)


def test_uplink_defaults_to_the_host_link_and_shares_its_mtu():
    cluster = Emulated(4, "1gbit", racks=2, mtu=9000)
    assert cluster.uplink == Link(10**9, None, 9000)
    slower = Emulated(4, "1gbit", racks=2, uplink="500mbit", delay="1ms")
    assert slower.uplink == Link(5 * 10**8, None, 1500)  # the delay is the hosts' own
    assert "2 racks of 2 hosts, uplinks 500mbit" in slower.describe()
    single = Emulated(4, "1gbit")
    assert single.racks == 1 and single.uplink is None and single.uplink_counters() == []
    assert single.describe_racks() == "" and "rack" not in single.describe()


def test_hosts_are_numbered_rack_by_rack():
    cluster = Emulated(8, "1gbit", racks=4)
    assert [cluster.rack_of(host) for host in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [Emulated(3, "1gbit").rack_of(host) for host in range(3)] == [0, 0, 0]
    with pytest.raises(ValueError, match="host must be between 0 and 7, got 8"):
        cluster.rack_of(8)


@pytest.mark.parametrize(("hosts", "racks", "nproc_per_host"), [(8, 2, 1), (8, 4, 2), (6, 3, 1)])
def test_a_ring_over_ranks_crosses_every_uplink_once_each_way(hosts, racks, nproc_per_host):
    cluster = Emulated(hosts, "1gbit", racks=racks)
    rack_of_rank = {}
    for host in range(hosts):
        for local_rank in range(nproc_per_host):
            env = rank_environment(cluster, host, local_rank, nproc_per_host, 29500)
            rack_of_rank[int(env["RANK"])] = cluster.rack_of(host)
    world = len(rack_of_rank)
    up, down = [0] * racks, [0] * racks
    for rank in range(world):
        source, destination = rack_of_rank[rank], rack_of_rank[(rank + 1) % world]
        if source != destination:
            up[source] += 1
            down[destination] += 1
    assert up == down == [1] * racks


def test_rack_names_fit_linux_interface_names_and_belong_to_the_layout():
    layout = Layout("abcdef")
    names = [layout.rack_bridge(253), layout.uplink_port(253), layout.spine_port(253)]
    assert names == ["abcdef-r253", "abcdef-u253", "abcdef-d253"]
    assert all(len(name) <= 15 for name in names)
    assert all(layout.owns_link(name) for name in [*names, layout.bridge, "abcdef-s0"])
    assert not any(
        layout.owns_link(name) for name in ["abcdef-h0", "abcdef-x0", "abcdefg-r0", "abcdef-r"]
    )
    assert layout.rack_of_bridge("abcdef-r12") == 12 and layout.rack_of_bridge("abcdef-u1") is None


@pytest.mark.parametrize(
    "argv", [["--delay", "1ms"], ["--mtu", "9000"], ["--prefix", "nu"], ["--hosts", "2"]]
)
def test_any_cluster_option_asks_for_the_cluster(argv):
    """Before, ``commpress bench --prefix nu`` (a cluster up under that name) and ``--mtu``
    or ``--delay`` alone ran local processes and said nothing."""
    parser = argparse.ArgumentParser()
    add_link_arguments(parser, required=False)
    assert not wants_cluster(parser.parse_args([]))
    assert wants_cluster(parser.parse_args(argv))


def test_rack_options_ask_for_the_cluster():
    parser = argparse.ArgumentParser()
    add_link_arguments(parser, required=False)
    racks = parser.parse_args(["--racks", "2", "--uplink", "500mbit"])
    assert wants_cluster(racks) and racks.racks == 2 and racks.uplink == "500mbit"
    with pytest.raises(SystemExit):
        parser.parse_args(["--racks", "0"])


class _ProcessesAsHosts:
    """A cluster whose hosts are local processes in this machine's own network namespace:
    ``run_on_cluster``'s paths without root."""

    hosts = 2
    namespaces = None
    addresses = ["127.0.0.1"] * hosts
    layout = types.SimpleNamespace(interface="lo")

    def describe(self) -> str:
        return "2 local processes"


class _HostsWithoutNamespaces(_ProcessesAsHosts):
    namespaces = ["cpt-gone-h0", "cpt-gone-h1"]  # no such namespaces: no cluster is up


def test_a_job_on_a_cluster_that_is_down_names_the_missing_namespace():
    from commpress.cluster.jobs import run_on_cluster
    from commpress.cluster.local import DistributedError

    with pytest.raises(DistributedError, match=r"no network namespace 'cpt-gone-h[01]'"):
        run_on_cluster(_HostsWithoutNamespaces(), _refuse_on_rank_one, timeout=60)


def _refuse_on_rank_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one refuses")
    return rank


def _exit_without_a_word_on_rank_one(rank: int, world_size: int) -> int:
    if rank == 1:
        os._exit(3)
    return rank


def test_a_job_rank_that_raises_reaches_the_caller_with_its_traceback():
    from commpress.cluster.jobs import run_on_cluster
    from commpress.cluster.local import DistributedError

    with pytest.raises(DistributedError, match=r"(?s)rank 1 failed:.*ValueError: rank one refuses"):
        run_on_cluster(_ProcessesAsHosts(), _refuse_on_rank_one, timeout=60)


def test_a_job_rank_that_dies_without_a_traceback_reports_the_status():
    from commpress.cluster.jobs import run_on_cluster
    from commpress.cluster.local import DistributedError

    with pytest.raises(DistributedError, match="2 local processes: rank 1 died with exit code 3"):
        run_on_cluster(_ProcessesAsHosts(), _exit_without_a_word_on_rank_one, timeout=60)


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_cluster_config import _ProcessesAsHosts
from commpress.cluster.jobs import run_on_cluster
{base}

def add_rank(rank, world_size, base):
    return base + rank + OFFSET

{call}
"""
GUARDED = """if __name__ == "__main__":
    print(run_on_cluster(_ProcessesAsHosts(), add_rank, 40, timeout=60))"""


def _run_script(folder, call: str, *how: str):
    """``python [how...]`` on a user script in ``folder/pkg/user_script.py``; run as a module
    (``-m``), it takes ``OFFSET`` from a module beside it by a relative import."""
    import subprocess
    import sys
    from pathlib import Path

    package = folder / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "beside.py").write_text("OFFSET = 0\n")
    base = "from .beside import OFFSET" if how else "OFFSET = 0"
    script = package / "user_script.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent), call=call, base=base))
    argv = [sys.executable, *how] if how else [sys.executable, str(script)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=folder)


@pytest.mark.parametrize("how", [(), ("-m", "pkg.user_script")])
def test_a_function_of_the_script_being_run_reaches_the_hosts(tmp_path, how):
    """``Emulated(...).run(fn, ...)`` with ``fn`` defined in the user's script, as docs/cluster.md
    shows it, run as a file or as a module: before, each rank failed with "Can't get
    attribute 'add_rank' on <module 'commpress.cluster.jobs'>"."""
    done = _run_script(tmp_path, GUARDED, *how)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[40, 41]"


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    """Its top level runs again on every host: there it must not build or run a cluster."""
    call = "print(run_on_cluster(_ProcessesAsHosts(), add_rank, 40, timeout=60))"
    done = _run_script(tmp_path, call)
    assert done.returncode != 0
    assert 'put it under `if __name__ == "__main__":`' in done.stderr


def test_a_process_hidden_by_proc_is_looked_for_with_a_signal(monkeypatch):
    """``/proc`` mounted with ``hidepid`` refuses to read another user's processes."""
    import builtins

    from commpress.cluster.system import running

    with open("/proc/sys/kernel/pid_max") as limit:
        never_a_pid = int(limit.read()) + 1
    real_open = builtins.open

    def hiding(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", hiding)
    assert running(os.getpid())
    assert not running(never_a_pid)


def test_entering_a_namespace_from_a_process_with_threads_is_refused():
    """A thread keeps the namespace it was started in: entering with two would leave one
    outside (this refusal comes before the namespace is even looked up)."""
    import threading

    from commpress.cluster.system import ClusterError, enter_namespace

    release = threading.Event()
    waiting = threading.Thread(target=release.wait)
    waiting.start()
    try:
        with pytest.raises(ClusterError, match=r"from a process of \d+ threads"):
            enter_namespace("cpt-never-made")
    finally:
        release.set()
        waiting.join()


class _QueueThatLags:
    """A results queue whose report shows up one poll after its rank has ended."""

    def __init__(self, report):
        self.polls, self.report = 0, report

    def get(self, timeout=None):
        self.polls += 1
        if self.polls == 1 or self.report is None:
            raise queue.Empty
        report, self.report = self.report, None
        return report


def test_a_rank_that_ended_after_reporting_is_not_taken_for_one_that_did_not(monkeypatch):
    """A rank that put its result and ended between an empty poll and the look at its exit
    code was reported as having ended without a result (a review reproduced it)."""
    from commpress.cluster import local

    monkeypatch.setattr(local, "POLL_SECONDS", 0.01)
    saved = io.BytesIO()
    torch.save("done", saved)
    ended = [types.SimpleNamespace(exitcode=0)]
    lagging = _QueueThatLags((0, True, saved.getvalue()))
    assert local._collect(ended, lagging, timeout=10, allow_dead=False) == ["done"]
    with pytest.raises(local.DistributedError, match="ended .exit code 0. without reporting"):
        local._collect(ended, _QueueThatLags(None), timeout=10, allow_dead=False)


class _Reports:
    """A results queue holding the given reports, then empty."""

    def __init__(self, *reports):
        self.reports = list(reports)

    def get(self, timeout=None):
        if not self.reports:
            raise queue.Empty
        return self.reports.pop(0)


def test_a_peer_that_failed_too_is_not_named_as_one_that_died(monkeypatch):
    """Both ranks of ``commpress train`` failed on the same error; the second, which had
    reported its failure and ended (exit code 0), was named ahead of the first's report as
    the peer that died first: 'rank 1 died with exit code 0; rank 0 failed: ...'."""
    from commpress.cluster import local

    monkeypatch.setattr(local, "DEATH_LOOK_SECONDS", 0.05)
    both_ended = [types.SimpleNamespace(exitcode=0)] * 2
    failures = _Reports((0, False, "ValueError: same"), (1, False, "ValueError: same"))
    with pytest.raises(local.DistributedError) as raised:
        local._collect(both_ended, failures, timeout=10, allow_dead=False)
    assert str(raised.value) == "rank 0 failed:\nValueError: same"


def test_a_hang_up_stops_a_run_as_a_ctrl_c_does():
    """SIGHUP (a closed terminal, a dropped ssh session) ended the process at once, leaving
    the emulated cluster behind."""
    import signal

    from commpress.cluster.system import deferred_signals

    inherited = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # pytest itself may run nohup
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGHUP"), deferred_signals() as received:
            os.kill(os.getpid(), signal.SIGHUP)
            assert received == [signal.SIGHUP]  # noted, not acted on, inside
    finally:
        signal.signal(signal.SIGHUP, inherited)
    ignored = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup: stays ignored
    try:
        with deferred_signals() as received:
            os.kill(os.getpid(), signal.SIGHUP)
        assert received == [] and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, ignored)


def test_removing_a_cluster_leaves_an_etc_netns_it_found_empty(tmp_path, monkeypatch):
    """``cluster down`` of a prefix that was not up deleted an empty /etc/netns it had not
    made; the folder goes only when the cluster's own folders were its last."""
    from commpress.cluster import emulated

    etc = tmp_path / "netns"
    etc.mkdir()
    monkeypatch.setattr(emulated, "NETNS_ETC", str(etc))
    monkeypatch.setattr(emulated, "present", lambda layout: [])
    emulated.remove(Layout("hq"))
    assert etc.is_dir()
    (etc / "hq-h0").mkdir()
    emulated.remove(Layout("hq"))
    assert not etc.exists()
