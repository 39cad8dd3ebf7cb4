"""Racks: a bridge per rack, joined through a spine by uplinks shaped both ways."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from commpress.cli import main
from commpress.cluster import (
    ClusterError,
    Emulated,
    Layout,
    cluster_for,
    present,
    remove,
    system,
)

RATE, UPLINK = "100mbit", "200mbit"  # different, so that a rate read back tells them apart
MEGABYTE = 1 << 20
PORT = 5201

SINK = f"""
import socket
server = socket.create_server(("", {PORT}))
print("ready", flush=True)
connection, _ = server.accept()
total = 0
while chunk := connection.recv(1 << 16):
    total += len(chunk)
print(total, flush=True)
"""

SOURCE = f"""
import socket, sys
with socket.create_connection((sys.argv[1], {PORT}), timeout=30) as connection:
    connection.sendall(bytes({MEGABYTE}))
"""

GROUP = "239.255.0.1"

MULTICAST_RECEIVER = f"""
import socket, struct, sys
own = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", {PORT}))
membership = struct.pack("4s4s", socket.inet_aton("{GROUP}"), socket.inet_aton(own))
s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
s.settimeout(10)
print("ready", flush=True)
print(s.recvfrom(64)[0].decode(), flush=True)
"""

MULTICAST_SENDER = f"""
import socket, sys
own = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(own))
s.sendto(("hello from " + own).encode(), ("{GROUP}", {PORT}))
"""


def python_in(cluster: Emulated, host: int, script: str, *arguments: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", cluster.namespaces[host], sys.executable, "-c", script, *arguments],
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_ready(process: subprocess.Popen) -> None:
    line = process.stdout.readline().strip()
    assert line == "ready", f"the script did not start: {line!r}"


def send_a_megabyte(cluster: Emulated, source: int, destination: int) -> None:
    """One TCP connection carries a megabyte from ``source`` to ``destination``."""
    sink = python_in(cluster, destination, SINK)
    try:
        wait_ready(sink)
        done = system.in_namespace(
            cluster.namespaces[source],
            sys.executable,
            "-c",
            SOURCE,
            cluster.addresses[destination],
        )
        assert done == ""
        received = sink.communicate(timeout=30)[0].strip()
    finally:
        sink.kill()
        sink.wait()
    assert int(received) == MEGABYTE


def uplink_traffic(cluster: Emulated, source: int, destination: int) -> list:
    before = cluster.uplink_counters()
    send_a_megabyte(cluster, source, destination)
    return [
        after - earlier for after, earlier in zip(cluster.uplink_counters(), before, strict=True)
    ]


def tbf_rate_bits(device: str) -> int:
    qdiscs = json.loads(system.tc("-j", "qdisc", "show", "dev", device))
    (tbf,) = [qdisc for qdisc in qdiscs if qdisc["kind"] == "tbf"]
    return tbf["options"]["rate"] * 8


def links_with(prefix: str) -> list[str]:
    return sorted(
        entry["ifname"]
        for entry in system.ip_json("link", "show")
        if entry["ifname"].startswith(f"{prefix}-")
    )


def test_traffic_within_a_rack_stays_off_the_uplinks_and_across_crosses_both(prefix):
    with Emulated(4, RATE, racks=2, uplink=UPLINK, prefix=prefix) as cluster:
        assert [cluster.rack_of(host) for host in range(4)] == [0, 0, 1, 1]
        within = uplink_traffic(cluster, 0, 1)
        across = uplink_traffic(cluster, 0, 2)
        back = uplink_traffic(cluster, 3, 1)
    # Within a rack: at most a flooded ARP request or two, never the payload.
    for counters in within:
        assert counters.tx_bytes < 16_384 and counters.rx_bytes < 16_384, within
    # Rack 0 to rack 1: up on rack 0's uplink, down on rack 1's; the other way only ACKs.
    assert across[0].tx_bytes >= MEGABYTE and across[1].rx_bytes >= MEGABYTE, across
    assert across[0].rx_bytes < MEGABYTE / 4 and across[1].tx_bytes < MEGABYTE / 4, across
    assert back[1].tx_bytes >= MEGABYTE and back[0].rx_bytes >= MEGABYTE, back
    assert back[1].rx_bytes < MEGABYTE / 4 and back[0].tx_bytes < MEGABYTE / 4, back


def test_racks_are_bridges_of_their_own_joined_to_the_spine_by_shaped_uplinks(prefix):
    with Emulated(4, RATE, racks=2, uplink=UPLINK, mtu=1400, prefix=prefix) as cluster:
        layout = cluster.layout
        masters = {
            entry["ifname"]: entry.get("master")
            for entry in system.ip_json("link", "show")
            if layout.owns_link(entry["ifname"])
        }
        bridges = {
            entry["ifname"]: entry["linkinfo"]["info_data"]
            for entry in system.ip_json("-d", "link", "show", "type", "bridge")
            if layout.owns_link(entry["ifname"])
        }
        for rack in range(2):
            up, down = layout.uplink_port(rack), layout.spine_port(rack)
            assert masters[up] == layout.rack_bridge(rack) and masters[down] == layout.bridge
            assert tbf_rate_bits(up) == tbf_rate_bits(down) == 200e6  # up and down alike
            for port in (up, down):
                assert system.ip_json("link", "show", "dev", port)[0]["mtu"] == 1400
        for host in range(4):
            port = layout.switch_port(host)
            assert masters[port] == layout.rack_bridge(cluster.rack_of(host))
            assert tbf_rate_bits(port) == 100e6
        assert sorted(bridges) == sorted(
            [layout.bridge, layout.rack_bridge(0), layout.rack_bridge(1)]
        )
        assert all(info["mcast_snooping"] == 0 for info in bridges.values())
        for name in bridges:
            with open(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6") as switch:
                assert switch.read().strip() == "1"


def test_one_multicast_datagram_reaches_every_host_of_every_rack(prefix):
    with Emulated(4, RATE, racks=2, uplink=UPLINK, prefix=prefix) as cluster:
        receivers = [
            python_in(cluster, host, MULTICAST_RECEIVER, cluster.addresses[host])
            for host in range(1, 4)
        ]
        try:
            for receiver in receivers:
                wait_ready(receiver)
            sender = python_in(cluster, 0, MULTICAST_SENDER, cluster.addresses[0])
            assert sender.wait(timeout=30) == 0
            outputs = [receiver.communicate(timeout=15)[0].strip() for receiver in receivers]
        finally:
            for receiver in receivers:
                receiver.kill()
                receiver.wait()
    assert outputs == [f"hello from {cluster.addresses[0]}"] * 3


def test_attach_restores_racks_and_uplink_and_down_leaves_nothing(prefix, capsys):
    namespaces, links = sorted(system.namespaces()), links_with(prefix)
    cluster = Emulated(6, RATE, racks=3, uplink=UPLINK, prefix=prefix).up()
    try:
        attached = Emulated.attach(prefix)
        assert (attached.hosts, attached.racks) == (6, 3)
        assert attached.uplink == cluster.uplink and attached.link == cluster.link
        assert [attached.rack_of(host) for host in range(6)] == [0, 0, 1, 1, 2, 2]
        assert len(attached.uplink_counters()) == 3
        with cluster_for(None, None, racks=3, uplink=UPLINK, prefix=prefix) as found:
            assert found.racks == 3
        with (
            pytest.raises(ClusterError, match="racks=2 but cluster .* 3 rack"),
            cluster_for(6, RATE, racks=2, prefix=prefix),
        ):
            pass
        with (
            pytest.raises(ClusterError, match="uplink='1gbit' but cluster .* uplinks 200mbit"),
            cluster_for(None, None, uplink="1gbit", prefix=prefix),
        ):
            pass
        with (  # before, an MTU or delay that the cluster up did not have was ignored
            pytest.raises(ClusterError, match="mtu=9000 but cluster .* MTU 1500"),
            cluster_for(None, None, mtu=9000, prefix=prefix),
        ):
            pass
        with (
            pytest.raises(ClusterError, match="delay='1ms' but cluster"),
            cluster_for(None, None, delay="1ms", prefix=prefix),
        ):
            pass
        with cluster_for(None, None, mtu=1500, prefix=prefix) as found:
            assert found.link.mtu == 1500
        assert main(["cluster", "status", "--prefix", prefix]) == 0
        status = capsys.readouterr().out
        assert "3 racks of 2 hosts, uplinks 200mbit" in status
        assert f"{prefix}-u2" in status and "4-5" in status
    finally:
        cluster.down()
    assert present(Layout(prefix)) == []
    assert sorted(system.namespaces()) == namespaces and links_with(prefix) == links == []


@pytest.mark.parametrize("removed", ["r1", "r1 u1"])
def test_a_cluster_whose_last_rack_was_removed_by_hand_is_incomplete_not_one_rack(prefix, removed):
    """Before, after `ip link del <prefix>-r1` two racks attached as one, with hosts 2 and
    3 on ports of no bridge: racks were counted by their bridges alone."""
    Emulated(4, RATE, racks=2, prefix=prefix).up()
    for name in removed.split():
        system.ip("link", "del", f"{prefix}-{name}")
    with pytest.raises(ClusterError, match=f"incomplete \\(missing: {prefix}-r1\\b"):
        Emulated.attach(prefix)
    remove(Layout(prefix))
    assert present(Layout(prefix)) == []


def test_one_rack_attaches_as_one_rack_and_refuses_an_uplink(prefix):
    with Emulated(2, RATE, prefix=prefix):
        attached = Emulated.attach(prefix)
        assert attached.racks == 1 and attached.uplink is None
        assert attached.uplink_counters() == []
        with (
            pytest.raises(ClusterError, match="one rack"),
            cluster_for(None, None, uplink=UPLINK, prefix=prefix),
        ):
            pass


# What `Emulated(2, "100mbit", prefix=p).up()` ran before racks existed: racks=1 must not
# change one character of it.
ONE_RACK_BUILD = """
ip link add name {p}-br type bridge mcast_snooping 0
ip link set {p}-br up
ip netns add {p}-h0
ip netns exec {p}-h0 sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
ip link add {p}-s0 type veth peer name eth0 netns {p}-h0
ip link set {p}-s0 mtu 1500 master {p}-br up
ip -n {p}-h0 link set lo up
ip -n {p}-h0 link set eth0 mtu 1500 up
ip -n {p}-h0 addr add 10.213.0.1/24 dev eth0
ip -n {p}-h0 route add 224.0.0.0/4 dev eth0
tc qdisc add dev {p}-s0 root tbf rate 100000000bit burst 65536 latency 50000us
tc -n {p}-h0 qdisc add dev eth0 root handle 1: tbf rate 100000000bit burst 65536 latency 50000us
ip netns add {p}-h1
ip netns exec {p}-h1 sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
ip link add {p}-s1 type veth peer name eth0 netns {p}-h1
ip link set {p}-s1 mtu 1500 master {p}-br up
ip -n {p}-h1 link set lo up
ip -n {p}-h1 link set eth0 mtu 1500 up
ip -n {p}-h1 addr add 10.213.0.2/24 dev eth0
ip -n {p}-h1 route add 224.0.0.0/4 dev eth0
tc qdisc add dev {p}-s1 root tbf rate 100000000bit burst 65536 latency 50000us
tc -n {p}-h1 qdisc add dev eth0 root handle 1: tbf rate 100000000bit burst 65536 latency 50000us
"""  # noqa: E501


@pytest.mark.parametrize("racks", [{}, {"racks": 1}])
def test_one_rack_builds_exactly_what_was_built_before_racks(prefix, monkeypatch, racks):
    commands = []

    def recording_run(*command):
        commands.append(" ".join(command))
        return real_run(*command)

    real_run = system.run
    monkeypatch.setattr(system, "run", recording_run)
    with Emulated(2, RATE, prefix=prefix, **racks):
        built = commands[2:]  # after the leftovers check (`ip -j netns list`, `ip -j link show`)
        assert links_with(prefix) == [f"{prefix}-br", f"{prefix}-s0", f"{prefix}-s1"]
    assert built == ONE_RACK_BUILD.format(p=prefix).strip().splitlines()


def test_a_failure_while_building_the_racks_leaves_nothing(prefix, monkeypatch):
    calls = []

    def failing_tc(*arguments):
        calls.append(arguments)
        if len(calls) == 4:  # the second rack's spine end
            raise ClusterError("simulated tc failure")
        return real_tc(*arguments)

    real_tc = system.tc
    monkeypatch.setattr(system, "tc", failing_tc)
    with pytest.raises(ClusterError, match="simulated"):
        Emulated(4, RATE, racks=2, prefix=prefix).up()
    assert present(Layout(prefix)) == [] and links_with(prefix) == []


def test_ctrl_c_while_building_the_racks_leaves_nothing(prefix, monkeypatch):
    calls = []

    def run(*command):
        calls.append(command)
        if len(calls) == 7:  # rack 0's uplink being made
            os.kill(os.getpid(), signal.SIGINT)
        return real_run(*command)

    real_run = system.run
    monkeypatch.setattr(system, "run", run)
    with pytest.raises(KeyboardInterrupt):
        Emulated(4, RATE, racks=2, prefix=prefix).up()
    assert present(Layout(prefix)) == [] and links_with(prefix) == []


def test_launch_builds_racks_for_the_job_and_removes_them(prefix, capsys):
    argv = ["launch", "--hosts", "4", "--link", RATE, "--racks", "2", "--uplink", UPLINK,
            "--prefix", prefix, "--", "sh", "-c", "echo rank $RANK of $WORLD_SIZE"]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "4 hosts, links 100mbit, mtu 1500, 2 racks of 2 hosts, uplinks 200mbit" in captured.err
    assert sorted(line for line in captured.out.splitlines() if "rank" in line) == [
        f"h{host}r{host}| rank {host} of 4" for host in range(4)
    ]
    assert present(Layout(prefix)) == []
    assert main(argv[:1] + ["--hosts", "3", "--link", RATE, "--racks", "2", "--prefix", prefix,
                            "--", "true"]) == 2  # fmt: skip
    assert "--racks 2 must divide --hosts 3" in capsys.readouterr().err
