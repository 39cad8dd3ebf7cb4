"""The emulated cluster itself: build and removal, links, rates, counters, multicast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster import (
    ClusterError,
    Emulated,
    Layout,
    emulated,
    present,
    read_local,
    remove,
    system,
)
from commpress.testing.parity import assert_same_bits

RATE = "100mbit"  # low enough that two cores are never the bottleneck
RATE_BYTES = 100e6 / 8


def host_network_state() -> dict:
    """Everything a cluster touches, as seen from the root namespace."""
    return {
        "links": sorted(entry["ifname"] for entry in system.ip_json("link", "show")),
        "addresses": system.ip("-j", "addr", "show"),
        "routes": system.ip("-j", "route", "show"),
        "namespaces": sorted(system.namespaces()),
        "qdiscs": system.tc("-j", "qdisc", "show"),
        "etc_netns": os.path.exists("/etc/netns") and sorted(os.listdir("/etc/netns")),
    }


def test_up_and_down_leave_the_host_exactly_as_before(prefix):
    before = host_network_state()
    with Emulated(3, RATE, prefix=prefix) as cluster:
        during = host_network_state()
        assert {f"{prefix}-h{i}" for i in range(3)} <= set(during["namespaces"])
        assert {f"{prefix}-br", f"{prefix}-s0", f"{prefix}-s2"} <= set(during["links"])
        attached = Emulated.attach(prefix)
        assert attached.hosts == 3 and attached.link == cluster.link
    assert host_network_state() == before


def test_each_host_is_shaped_both_ways_and_routes_multicast(prefix):
    with Emulated(2, RATE, mtu=1400, prefix=prefix) as cluster:
        for host, namespace in enumerate(cluster.namespaces):
            sending = json.loads(system.tc("-j", "-n", namespace, "qdisc", "show", "dev", "eth0"))
            receiving = json.loads(
                system.tc("-j", "qdisc", "show", "dev", cluster.layout.switch_port(host))
            )
            for qdisc in (sending[0], receiving[0]):
                assert qdisc["kind"] == "tbf" and qdisc["options"]["rate"] * 8 == 100e6
            routes = system.ip("-n", namespace, "route", "show")
            assert "224.0.0.0/4 dev eth0" in routes
            assert system.ip_json("-n", namespace, "link", "show", "dev", "eth0")[0]["mtu"] == 1400


def test_an_existing_cluster_is_an_error_and_is_left_intact(prefix):
    with Emulated(2, RATE, prefix=prefix):
        existing = present(Layout(prefix))
        with pytest.raises(ClusterError, match=f"already exists.*cluster down --prefix {prefix}"):
            Emulated(3, RATE, prefix=prefix).up()
        assert present(Layout(prefix)) == existing


def test_a_second_builder_of_the_same_prefix_leaves_the_first_one_s_cluster_alone(
    prefix, monkeypatch
):
    # two `commpress launch` started together: both look for leftovers before either builds
    with Emulated(2, RATE, prefix=prefix):
        existing = present(Layout(prefix))
        looks = []  # the first look finds nothing; any later one, what is there

        def late_look(layout):
            looks.append(layout)
            return [] if len(looks) == 1 else present(layout)

        monkeypatch.setattr(emulated, "present", late_look)
        with pytest.raises(ClusterError, match=f"already exists \\({prefix}-br\\)"):
            Emulated(2, RATE, prefix=prefix).up()
        assert present(Layout(prefix)) == existing


@pytest.mark.parametrize("left", ["the bridge", "all but a host's port"])
def test_what_a_killed_build_left_is_incomplete_and_says_how_to_remove_it(prefix, left):
    """Before, a lone bridge was 'no cluster is up: start one with cluster up' (which then
    refused: it exists), and a missing port an obscure tc error."""
    if left == "the bridge":
        system.ip("link", "add", f"{prefix}-br", "type", "bridge")
    else:
        Emulated(2, RATE, prefix=prefix).up()
        system.ip("link", "del", f"{prefix}-s1")
    try:
        with pytest.raises(ClusterError, match=f"incomplete.*cluster down --prefix {prefix}"):
            Emulated.attach(prefix)
    finally:
        remove(Layout(prefix))


def test_a_failure_while_building_leaves_nothing(prefix, monkeypatch):
    calls = []

    def failing_tc(*arguments):
        calls.append(arguments)
        if len(calls) == 3:  # the second host's first qdisc
            raise ClusterError("simulated tc failure")
        return real_tc(*arguments)

    real_tc = system.tc
    monkeypatch.setattr(system, "tc", failing_tc)
    with pytest.raises(ClusterError, match="simulated"):
        Emulated(3, RATE, prefix=prefix).up()
    assert present(Layout(prefix)) == []


def interrupting(monkeypatch, at_call: int) -> None:
    """SIGINT to this process while ``system.run`` runs its ``at_call``-th command."""
    calls = []

    def run(*command):
        calls.append(command)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return real_run(*command)

    real_run = system.run
    monkeypatch.setattr(system, "run", run)


@pytest.mark.parametrize("at_call", [1, 6, 24])  # the leftovers check, host 0, host 1's last tc
def test_ctrl_c_while_building_leaves_nothing_even_where_sigint_was_ignored(
    prefix, monkeypatch, at_call
):
    interrupting(monkeypatch, at_call)
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a script's background job
    try:
        with pytest.raises(KeyboardInterrupt):
            Emulated(2, RATE, prefix=prefix).up()
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert present(Layout(prefix)) == []


def test_ctrl_c_while_removing_finishes_the_removal_first(prefix, monkeypatch):
    cluster = Emulated(3, RATE, prefix=prefix).up()
    interrupting(monkeypatch, 4)  # the first `ip netns del`
    with pytest.raises(KeyboardInterrupt):
        cluster.down()
    assert present(Layout(prefix)) == []


def test_hosts_resolve_each_other_both_ways(prefix):
    """Also from the IPv4-mapped form in which c10d's dual-stack TCPStore sees its peers."""
    lookups = f"""
import socket
for address in ["10.213.0.1", "10.213.0.2", "::ffff:10.213.0.2"]:
    print(socket.getnameinfo((address, 0), socket.NI_NAMEREQD)[0])
print(socket.gethostbyname("{prefix}-h1"), socket.gethostbyname(socket.gethostname()))
"""
    with Emulated(2, RATE, prefix=prefix) as cluster:
        done = system.in_namespace(cluster.namespaces[0], sys.executable, "-c", lookups)
    names = [f"{prefix}-h0", f"{prefix}-h1", f"{prefix}-h1"]
    assert done.split() == [*names, "10.213.0.2", "10.213.0.1"]


def _where_a_rank_runs(rank, world_size):
    import socket

    names = [
        socket.getnameinfo((a, 0), socket.NI_NAMEREQD)[0] for a in ("10.213.0.1", "10.213.0.2")
    ]
    with open("/proc/self/mountinfo") as mounts:
        shared = [line for line in mounts if " shared:" in line]
    return [name for _, name in socket.if_nameindex()], names, shared


def test_a_rank_of_cluster_run_is_inside_its_host_and_leaves_the_machine_s_mounts_alone(prefix):
    """``cluster.run`` forks its ranks and moves them into their hosts
    (``system.enter_namespace``): the host's interfaces, its hosts file, mounts that
    propagate nowhere; the machine's own mounts and /etc/hosts unchanged after the job."""
    with Emulated(2, RATE, prefix=prefix) as cluster:
        with open("/proc/self/mountinfo") as mounts, open("/etc/hosts") as hosts:
            before = mounts.read(), hosts.read()
        found = cluster.run(_where_a_rank_runs, timeout=60)
        with open("/proc/self/mountinfo") as mounts, open("/etc/hosts") as hosts:
            assert (mounts.read(), hosts.read()) == before
    for interfaces, names, shared in found:
        assert interfaces == ["lo", "eth0"]
        assert names == [f"{prefix}-h0", f"{prefix}-h1"]
        assert shared == []


def test_without_root_or_tools_the_error_says_what_to_do(prefix, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        Emulated(2, RATE, prefix=prefix).up()
    monkeypatch.undo()
    monkeypatch.setattr(system.shutil, "which", lambda tool: None if tool == "tc" else "/x")
    with pytest.raises(ClusterError, match="tc not found: install iproute2"):
        Emulated(2, RATE, prefix=prefix).up()
    assert present(Layout(prefix)) == []


def test_delay_is_netem_under_the_rate_limit_or_a_clear_error(prefix):
    cluster = Emulated(2, RATE, delay="2ms", prefix=prefix)
    try:
        cluster.up()
    except ClusterError as error:  # this kernel has no sch_netem (the project's VMs)
        assert "sch_netem" in str(error)
    else:
        qdiscs = system.tc("-n", cluster.namespaces[0], "qdisc", "show", "dev", "eth0")
        cluster.down()
        assert "tbf" in qdiscs and "netem" in qdiscs and "delay 2ms" in qdiscs
    assert present(Layout(prefix)) == []


# -- ranks across namespaces ----------------------------------------------------------


def _gather_native_and_ring(rank, world_size):
    generator = torch.Generator().manual_seed(rank)
    inp = torch.randn(100_000, generator=generator)
    outputs = {}
    for algorithm, codec in [("native", "none"), ("ring", "int8"), ("ring", "none")]:
        out = torch.empty(world_size * inp.numel())
        cp.all_gather_into_tensor(out, inp, codec=codec, algorithm=algorithm)
        outputs[algorithm, codec] = out
    return outputs


def test_gloo_all_gather_across_namespaces(prefix):
    with Emulated(2, "1gbit", prefix=prefix) as cluster:
        first, second = cluster.run(_gather_native_and_ring, timeout=120)
    native = first["native", "none"]
    assert torch.equal(
        native[:100_000], torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    )
    assert torch.equal(first["ring", "none"], native)
    for key in first:
        assert_same_bits(first[key], second[key])
    # int8 blocks: |error| <= absmax / 254 per block; over Gaussian data well under 1% relative.
    error = (first["ring", "int8"] - native).norm() / native.norm()
    assert 0 < error < 1e-2


def _transfer(rank, world_size, numel, receiver):
    """Every rank but ``receiver`` sends ``numel`` floats to it at once; the receiver's view."""
    payload = torch.ones(numel)
    dist.barrier()
    before, start = read_local("eth0"), time.perf_counter()
    if rank == receiver:
        works = [dist.irecv(torch.empty(numel), src) for src in range(world_size) if src != rank]
    else:
        works = [dist.isend(payload, receiver)]
    for work in works:
        work.wait()
    elapsed = time.perf_counter() - start
    dist.barrier()
    return elapsed, read_local("eth0") - before


def test_a_large_send_runs_at_the_link_rate(prefix):
    numel = 2 << 20  # 8 MiB: 0.67 s at 100 Mbit/s
    with Emulated(2, RATE, prefix=prefix) as cluster:
        (seconds, received), (_, sent) = cluster.run(_transfer, numel, 0, timeout=120)
    goodput = 4 * numel / seconds
    assert abs(goodput / RATE_BYTES - 1) < 0.10, f"{goodput * 8 / 1e6:.1f} Mbit/s"
    assert sent.tx_bytes >= 4 * numel and received.rx_bytes >= 4 * numel


def test_a_host_cannot_receive_faster_than_its_link(prefix):
    """Two senders at full rate into one host: the switch side of its link is the limit."""
    numel = 1 << 20
    with Emulated(3, RATE, prefix=prefix) as cluster:
        (seconds, received), *_ = cluster.run(_transfer, numel, 0, timeout=120)
    goodput = 2 * 4 * numel / seconds
    assert abs(goodput / RATE_BYTES - 1) < 0.10, f"{goodput * 8 / 1e6:.1f} Mbit/s"


def _counted_all_gather(rank, world_size, numel):
    inp = torch.randn(numel)
    out = torch.empty(world_size * numel)
    cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="ring")  # connect, warm up
    dist.barrier()
    before = read_local("eth0")
    cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="ring")
    dist.barrier()  # what this rank sent has reached its peers
    return (read_local("eth0") - before).tx_bytes


def test_counters_agree_with_the_bytes_the_collective_sends(prefix):
    numel = 1 << 20
    wire = cp.get_codec("int8").wire_bytes(numel, torch.float32) * (3 - 1)
    with Emulated(3, "1gbit", prefix=prefix) as cluster:
        sent = cluster.run(_counted_all_gather, numel, timeout=120)
    for tx_bytes in sent:
        # Headers (one per segment of up to 64 KiB), ACKs and the barrier: a few percent.
        assert wire <= tx_bytes <= 1.05 * wire + 16_384


MULTICAST_SCRIPT = """
import socket, struct, sys
group, port, role = "239.1.2.3", 5007, sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
if role == "send":
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    for _ in range(50):
        s.sendto(b"hello", (group, port))
        import time; time.sleep(0.05)
else:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                 struct.pack("4sl", socket.inet_aton(group), socket.INADDR_ANY))
    s.settimeout(5)
    print(s.recvfrom(64)[0].decode())
"""


def test_one_multicast_datagram_reaches_every_other_host(prefix):
    with Emulated(3, RATE, prefix=prefix) as cluster:
        receivers = [
            subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-c", MULTICAST_SCRIPT, "recv"],
                stdout=subprocess.PIPE,
                text=True,
            )
            for ns in cluster.namespaces[1:]
        ]
        time.sleep(0.5)
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                cluster.namespaces[0],
                sys.executable,
                "-c",
                MULTICAST_SCRIPT,
                "send",
            ],
            check=True,
            timeout=30,
        )
        outputs = [receiver.communicate(timeout=10)[0].strip() for receiver in receivers]
    assert outputs == ["hello", "hello"]
