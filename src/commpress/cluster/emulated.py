"""An emulated cluster: hosts in network namespaces, joined by a bridge through slow links.

Every host link is shaped in both directions (a token bucket on the host's end
of its veth limits what it sends, one on the switch's end limits what it
receives), so a host behaves like one with a full-duplex NIC of the given rate.

With ``racks`` > 1 the network has two levels: the hosts of each rack share a
bridge of their own, and every rack bridge joins the spine bridge through an
uplink shaped the same way in both directions (a token bucket on the rack's end
limits what the rack sends up, one on the spine's end what it receives down).
Hosts are numbered rack by rack; traffic between two hosts of one rack never
crosses an uplink. Every bridge floods multicast to all its ports, so a
multicast datagram reaches every host of every rack.

Building is all or nothing: a failure or Ctrl-C part way removes what was made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from commpress.cluster import system
from commpress.cluster.counters import PROC_NET_DEV, Counters, parse_net_dev
from commpress.cluster.layout import (
    DEFAULT_PREFIX,
    MULTICAST_ROUTE,
    Layout,
    check_hosts,
)
from commpress.cluster.link import DEFAULT_MTU, Link, format_rate, parse_delay
from commpress.cluster.system import NETNS_ETC, ClusterError
from commpress.units import check_racks, counted

NETEM_MISSING = (
    "delay needs the kernel's sch_netem qdisc, which this kernel does not provide "
    "(try `modprobe sch_netem`); run without a delay"
)


class Emulated:
    """``with Emulated(hosts=4, link="1gbit") as cluster: ...`` builds, then removes, a cluster.

    ``link`` is a rate such as ``"1gbit"`` or ``"100mbit"`` (or bits per second as an
    int); ``delay`` (``"1ms"``) is added to every packet a host sends; ``prefix``
    names the namespaces and links, so that separate clusters can coexist.

    ``racks`` (dividing ``hosts``) splits the hosts into racks of ``hosts // racks``,
    numbered rack by rack, each rack joined to a spine by an uplink of rate ``uplink``
    each way (a rate like ``link``; the host link's rate if left out). With one rack
    (the default) there is no spine and no uplink: one bridge joins every host.
    """

    def __init__(
        self,
        hosts: int,
        link: str | int = "1gbit",
        *,
        racks: int = 1,
        uplink: str | int | None = None,
        delay: str | None = None,
        mtu: int = DEFAULT_MTU,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.hosts = check_hosts(hosts)
        self.racks = check_racks(racks, self.hosts)
        self.link = Link.parse(link, delay, mtu)
        self.uplink = _uplink(self.racks, uplink, self.link)
        self.layout = Layout(prefix)

    # -- life cycle ---------------------------------------------------------------------

    def up(self) -> Emulated:
        system.check_can_build()
        with system.deferred_signals() as interrupted:  # raises KeyboardInterrupt on leaving
            leftovers = present(self.layout)
            if leftovers:
                raise self._already_exists(leftovers)
            self._claim()
            try:
                self._build(interrupted)
            except BaseException:  # never leave half a cluster behind
                remove(self.layout)
                raise
            if interrupted:  # the build stopped part way
                remove(self.layout)
        return self

    def _already_exists(self, leftovers: list[str]) -> ClusterError:
        return ClusterError(
            f"a cluster named {self.layout.prefix!r} already exists "
            f"({', '.join(leftovers)}): remove it with `commpress cluster down --prefix "
            f"{self.layout.prefix}` or pick another prefix"
        )

    def _claim(self) -> None:
        """Add the bridge, before anything else: of two builders of one prefix, the one
        that comes second fails here, and leaves the first one's cluster alone."""
        bridge = self.layout.bridge
        try:
            self._create_bridge(bridge)
        except ClusterError:
            if system.link_exists(bridge):
                raise self._already_exists([bridge]) from None
            raise

    def down(self) -> None:
        remove(self.layout)

    def __enter__(self) -> Emulated:
        return self.up()

    def __exit__(self, *exc_info) -> None:
        self.down()

    @classmethod
    def attach(cls, prefix: str = DEFAULT_PREFIX) -> Emulated:
        """The cluster that ``commpress cluster up`` (or another process) built."""
        layout = Layout(prefix)
        leftovers = present(layout)
        if not leftovers:
            raise ClusterError(not_up(prefix))
        hosts = _built_hosts(layout, leftovers)
        missing = _missing_parts(layout, hosts, leftovers)
        if missing:
            raise ClusterError(
                f"cluster {prefix!r} is incomplete (missing: {', '.join(missing)}): "
                f"`commpress cluster down --prefix {prefix}` and build it again"
            )
        racks = _read_racks(layout, hosts)
        cluster = cls.__new__(cls)
        cluster.hosts, cluster.racks, cluster.layout = hosts, racks, layout
        cluster.link = _read_link(layout)
        cluster.uplink = _read_uplink(layout) if racks > 1 else None
        return cluster

    def _build(self, interrupted: list[int]) -> None:
        layout, link = self.layout, self.link
        self._set_up_bridge(layout.bridge)  # the switch; with racks, the spine
        if self.racks > 1:
            for rack in range(self.racks):
                if interrupted:
                    return
                self._add_rack(rack)
        for host in range(self.hosts):
            if interrupted:
                return
            namespace, port = layout.namespace(host), layout.switch_port(host)
            system.ip("netns", "add", namespace)
            system.in_namespace(
                namespace,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            )
            system.ip(
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                layout.interface,
                "netns",
                namespace,
            )
            system.disable_ipv6(port)
            system.ip("link", "set", port, "mtu", str(link.mtu), "master", self._switch(host), "up")
            system.ip("-n", namespace, "link", "set", "lo", "up")
            system.ip("-n", namespace, "link", "set", layout.interface, "mtu", str(link.mtu), "up")
            system.ip(
                "-n",
                namespace,
                "addr",
                "add",
                f"{layout.address(host)}/{layout.prefix_length}",
                "dev",
                layout.interface,
            )
            system.ip("-n", namespace, "route", "add", MULTICAST_ROUTE, "dev", layout.interface)
            self._shape(namespace, port)
            self._write_hosts_file(namespace)

    def _add_bridge(self, name: str) -> None:
        """A bridge that floods multicast to every port (no snooping), without IPv6."""
        self._create_bridge(name)
        self._set_up_bridge(name)

    def _create_bridge(self, name: str) -> None:
        system.ip("link", "add", "name", name, "type", "bridge", "mcast_snooping", "0")

    def _set_up_bridge(self, name: str) -> None:
        system.disable_ipv6(name)
        system.ip("link", "set", name, "up")

    def _add_rack(self, rack: int) -> None:
        """Rack ``rack``'s bridge and its uplink to the spine, shaped both ways."""
        layout, uplink = self.layout, self.uplink
        bridge, up, down = (
            layout.rack_bridge(rack),
            layout.uplink_port(rack),
            layout.spine_port(rack),
        )
        self._add_bridge(bridge)
        system.ip("link", "add", up, "type", "veth", "peer", "name", down)
        for port, master in ((up, bridge), (down, layout.bridge)):
            system.disable_ipv6(port)
            system.ip("link", "set", port, "mtu", str(uplink.mtu), "master", master, "up")
            # on `up` what the rack sends to the spine, on `down` what it receives from it
            system.tc("qdisc", "add", "dev", port, "root", *uplink.tbf_arguments())

    def _switch(self, host: int) -> str:
        """The bridge ``host``'s port belongs to: its rack's, or the only one."""
        if self.racks == 1:
            return self.layout.bridge
        return self.layout.rack_bridge(self.rack_of(host))

    def _shape(self, namespace: str, port: str) -> None:
        tbf = self.link.tbf_arguments()
        system.tc("qdisc", "add", "dev", port, "root", *tbf)  # what the host receives
        system.tc(
            "-n",
            namespace,
            "qdisc",
            "add",
            "dev",
            self.layout.interface,
            "root",
            "handle",
            "1:",
            *tbf,
        )  # what the host sends
        if self.link.delay_s is not None:
            try:
                system.tc(
                    "-n",
                    namespace,
                    "qdisc",
                    "add",
                    "dev",
                    self.layout.interface,
                    "parent",
                    "1:1",
                    "handle",
                    "10:",
                    *self.link.netem_arguments(),
                )
            except ClusterError as error:
                if "unknown" in str(error).lower():
                    raise ClusterError(NETEM_MISSING) from None
                raise

    def _write_hosts_file(self, namespace: str) -> None:
        """Hosts resolve each other's names and addresses, and the machine's own name to
        themselves.

        Addresses resolve back also in the IPv4-mapped IPv6 form (``::ffff:10.213.0.1``) in
        which a dual-stack socket, c10d's TCPStore for one, sees its peers: an address missing
        here goes to a DNS server no host can reach, and c10d warns on every rank that "the
        hostname of the client socket cannot be retrieved".
        """
        own = self.layout.host_of(namespace)
        lines = ["127.0.0.1 localhost"]
        for host in range(self.hosts):
            names = [self.layout.namespace(host)] + ([socket.gethostname()] if host == own else [])
            lines.append(f"{self.layout.address(host)} {' '.join(names)}")
        lines += [
            f"::ffff:{self.layout.address(h)} {self.layout.namespace(h)}" for h in range(self.hosts)
        ]
        folder = os.path.join(NETNS_ETC, namespace)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hosts"), "w") as hosts:
            hosts.write("\n".join(lines) + "\n")

    # -- what runs on it ----------------------------------------------------------------

    @property
    def namespaces(self) -> list[str]:
        return [self.layout.namespace(h) for h in range(self.hosts)]

    @property
    def addresses(self) -> list[str]:
        return [self.layout.address(h) for h in range(self.hosts)]

    def rack_of(self, host: int) -> int:
        """The rack of host ``host``: hosts are numbered rack by rack."""
        if isinstance(host, bool) or not isinstance(host, int):
            raise TypeError(f"host must be an int, got {type(host).__name__}")
        if not 0 <= host < self.hosts:
            raise ValueError(f"host must be between 0 and {self.hosts - 1}, got {host}")
        return host // (self.hosts // self.racks)

    def counters(self) -> list[Counters]:
        """Traffic counters of every host's link, host 0 first (snapshot; subtract two)."""
        return [
            parse_net_dev(system.in_namespace(ns, "cat", "/proc/net/dev"), self.layout.interface)
            for ns in self.namespaces
        ]

    def uplink_counters(self) -> list[Counters]:
        """Traffic counters of every rack's uplink, rack 0 first (snapshot; subtract two);
        ``[]`` with one rack.

        Read on the rack's end (``<prefix>-u<k>``) from the root namespace: ``tx`` is what
        the rack sent up to the spine, ``rx`` what it received down from it.
        """
        if self.racks == 1:
            return []
        with open(PROC_NET_DEV) as table:  # the caller's namespace: the one that built it
            text = table.read()
        return [parse_net_dev(text, self.layout.uplink_port(k)) for k in range(self.racks)]

    def launch(self, command: Sequence[str], **options) -> int:
        """Run ``command`` as a multi-node job; see :func:`commpress.cluster.launcher.launch`."""
        from commpress.cluster.launcher import launch

        return launch(self, command, **options)

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> list[Any]:
        """``fn(rank, world_size, *args)`` with one gloo rank per host; results by rank."""
        from commpress.cluster.jobs import run_on_cluster

        return run_on_cluster(self, fn, *args, timeout=timeout)

    def describe_racks(self) -> str:
        """``"2 racks of 4 hosts, uplinks 500mbit"``; empty with one rack."""
        if self.racks == 1:
            return ""
        return (
            f"{self.racks} racks of {counted(self.hosts // self.racks, 'host')}, "
            f"uplinks {format_rate(self.uplink.rate_bits)}"
        )

    def describe(self) -> str:
        racks = f", {self.describe_racks()}" if self.racks > 1 else ""
        return (
            f"{counted(self.hosts, 'host')}, links {self.link.describe()}{racks}, "
            f"prefix {self.layout.prefix!r}"
        )


def _uplink(racks: int, uplink, link: Link) -> Link | None:
    """The uplinks' link: ``uplink``'s rate (the host link's if None), the hosts' MTU."""
    if racks == 1:
        if uplink is not None:
            raise ValueError(f"uplink={uplink!r} needs racks > 1: one rack has no uplink")
        return None
    try:
        return Link.parse(link.rate_bits if uplink is None else uplink, None, link.mtu)
    except (TypeError, ValueError) as error:
        raise type(error)(f"uplink: {error}") from None


def present(layout: Layout) -> list[str]:
    """Namespaces and links of ``layout`` that exist now."""
    found = [ns for ns in system.namespaces() if layout.host_of(ns) is not None]
    links = [entry["ifname"] for entry in system.ip_json("link", "show")]
    found += [name for name in links if layout.owns_link(name)]
    found += [path for path in _etc_folders(layout) if os.path.basename(path) not in found]
    return found


def _built_hosts(layout: Layout, leftovers: list[str]) -> int:
    """How many hosts the cluster of ``layout`` was built with, by every trace a host leaves:
    its namespace, its switch port, its ``/etc/netns`` folder, and its name in any host's
    hosts file (each lists every host). At least 1."""
    names = [os.path.basename(name) for name in leftovers] + _names_in_hosts_files(layout)
    seen = [layout.host_of(name) for name in names] + [layout.host_of_port(n) for n in names]
    return max((host for host in seen if host is not None), default=0) + 1


def _names_in_hosts_files(layout: Layout) -> list[str]:
    names: list[str] = []
    for folder in _etc_folders(layout):
        with contextlib.suppress(OSError), open(os.path.join(folder, "hosts")) as hosts:
            names += hosts.read().split()
    return names


def _missing_parts(layout: Layout, hosts: int, leftovers: list[str]) -> list[str]:
    """What building ``hosts`` hosts of ``layout`` makes and is not there now."""
    missing = [] if layout.bridge in leftovers else [layout.bridge]
    for host in range(hosts):
        namespace, folder = layout.namespace(host), os.path.join(NETNS_ETC, layout.namespace(host))
        missing += [name for name in (namespace, layout.switch_port(host)) if name not in leftovers]
        missing += [] if os.path.isdir(folder) else [folder]
    return missing


def _etc_folders(layout: Layout) -> list[str]:
    if not os.path.isdir(NETNS_ETC):
        return []
    return [
        os.path.join(NETNS_ETC, name)
        for name in sorted(os.listdir(NETNS_ETC))
        if layout.host_of(name) is not None
    ]


def remove(layout: Layout) -> list[str]:
    """Remove everything of ``layout`` (processes inside its hosts too); what was removed."""
    with system.deferred_signals():  # a second Ctrl-C waits for the cleanup to finish
        removed = present(layout)
        for namespace in (name for name in removed if layout.host_of(name) is not None):
            _kill_processes_in(namespace)
            _quietly(system.ip, "netns", "del", namespace)
        for name in removed:  # ports may outlive namespaces; one end of an uplink takes both
            if layout.host_of(name) is None and "/" not in name:
                _quietly(system.ip, "link", "del", name)
        folders = _etc_folders(layout)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        if folders and not os.listdir(NETNS_ETC):  # left empty by us: made by us too
            os.rmdir(NETNS_ETC)
    return removed


def _kill_processes_in(namespace: str) -> None:
    try:
        pids = system.ip("netns", "pids", namespace).split()
    except ClusterError:
        return
    for pid in map(int, pids):
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _quietly(action, *arguments) -> None:
    with contextlib.suppress(ClusterError):  # already gone
        action(*arguments)


def _read_rate_bits(device: str) -> int:
    """The rate of the token bucket on ``device`` (root namespace), in bits per second."""
    qdiscs = json.loads(system.tc("-j", "qdisc", "show", "dev", device) or "[]")
    tbf = next((q for q in qdiscs if q.get("kind") == "tbf"), None)
    if tbf is None:
        raise ClusterError(f"{device} has no rate limit: the cluster is incomplete")
    return int(tbf["options"]["rate"]) * 8


def _read_racks(layout: Layout, hosts: int) -> int:
    """How many racks the cluster of ``layout`` has: 1 where no rack bridge or uplink is
    left, else as many as the highest rack any of them names (at least two: one rack has
    none), each of which must be whole."""
    links = [entry["ifname"] for entry in system.ip_json("link", "show")]
    seen = [k for k in map(layout.rack_of_link, links) if k is not None]
    if not seen:
        return 1
    racks = max(max(seen) + 1, 2)
    parts = (layout.rack_bridge, layout.uplink_port, layout.spine_port)
    missing = [part(k) for k in range(racks) for part in parts if part(k) not in links]
    if missing or hosts % racks:
        trouble = (
            f"missing: {', '.join(missing)}"
            if missing
            else f"{racks} racks of {counted(hosts, 'host')}"
        )
        raise ClusterError(
            f"cluster {layout.prefix!r} is incomplete ({trouble}): "
            f"`commpress cluster down --prefix {layout.prefix}` and build it again"
        )
    return racks


def _read_uplink(layout: Layout) -> Link:
    mtu = system.ip_json("link", "show", "dev", layout.uplink_port(0))[0]["mtu"]
    return Link.parse(_read_rate_bits(layout.uplink_port(0)), None, mtu)


def _read_link(layout: Layout) -> Link:
    rate_bits = _read_rate_bits(layout.switch_port(0))
    host_qdiscs = json.loads(
        system.tc("-j", "-n", layout.namespace(0), "qdisc", "show", "dev", layout.interface) or "[]"
    )
    netem = next((q for q in host_qdiscs if q.get("kind") == "netem"), None)
    delay = None
    if netem is not None:
        delay_s = netem.get("options", {}).get("delay", {}).get("delay")
        delay = f"{delay_s * 1e6:.0f}us" if delay_s else None
    mtu = system.ip_json("link", "show", "dev", layout.switch_port(0))[0]["mtu"]
    return Link.parse(rate_bits, delay, mtu)


def not_up(prefix: str) -> str:
    """That no cluster named ``prefix`` is up, and the command that starts one of that name."""
    return (
        f"no cluster named {prefix!r} is up: start one with "
        f"`commpress cluster up --prefix {prefix} --hosts N --link RATE`"
    )


@contextlib.contextmanager
def cluster_for(
    hosts: int | None,
    link: str | None,
    *,
    racks: int | None = None,
    uplink: str | None = None,
    delay: str | None = None,
    mtu: int | None = None,
    prefix: str = DEFAULT_PREFIX,
) -> Iterator[Emulated]:
    """The cluster named ``prefix`` if it is up (checked against ``hosts``/``link``/``racks``/
    ``uplink``/``delay``/``mtu``, each where given), else a new one built from them (one
    rack where ``racks`` is None, :data:`~commpress.cluster.link.DEFAULT_MTU` where ``mtu``
    is) and removed on exit. :class:`ClusterError` where none is up and ``hosts`` or
    ``link`` is not given, or where the one up does not match them."""
    layout = Layout(prefix)
    if present(layout):
        cluster = Emulated.attach(prefix)
        if hosts is not None and hosts != cluster.hosts:
            raise ClusterError(
                f"hosts={hosts} but cluster {prefix!r} is up with "
                f"{counted(cluster.hosts, 'host')}: "
                f"`commpress cluster down --prefix {prefix}` first, or drop --hosts"
            )
        if link is not None and Link.parse(link).rate_bits != cluster.link.rate_bits:
            raise ClusterError(
                f"link={link!r} but cluster {prefix!r} is up with {cluster.link.describe()}"
            )
        if racks is not None and racks != cluster.racks:
            raise ClusterError(
                f"racks={racks} but cluster {prefix!r} is up with "
                f"{counted(cluster.racks, 'rack')}: "
                f"`commpress cluster down --prefix {prefix}` first, or drop --racks"
            )
        if uplink is not None and (
            cluster.uplink is None or Link.parse(uplink).rate_bits != cluster.uplink.rate_bits
        ):
            has = cluster.describe_racks() or "one rack (no uplink)"
            raise ClusterError(f"uplink={uplink!r} but cluster {prefix!r} is up with {has}")
        if mtu is not None and mtu != cluster.link.mtu:
            raise ClusterError(
                f"mtu={mtu} but cluster {prefix!r} is up with MTU {cluster.link.mtu}"
            )
        if delay is not None and abs(parse_delay(delay) - (cluster.link.delay_s or 0)) > 1e-6:
            raise ClusterError(
                f"delay={delay!r} but cluster {prefix!r} is up with {cluster.link.describe()}"
            )
        yield cluster
        return
    if hosts is None or link is None:
        raise ClusterError(
            f"{not_up(prefix)}, or give both --hosts and --link to build one for this command"
        )
    racks = 1 if racks is None else racks
    mtu = DEFAULT_MTU if mtu is None else mtu
    with Emulated(
        hosts, link, racks=racks, uplink=uplink, delay=delay, mtu=mtu, prefix=prefix
    ) as cluster:
        yield cluster
