"""Networks the cost model places hosts on, and the bytes each link carries.

A topology turns flows (unicast: source, destination, bytes) and broadcasts (a root's
payload to every other host, copied by the switches) into bytes per link. Links come in
*levels* (``host up``, ``uplink down``, ...); a level is an array with one entry per
bundle: the host link of each host, the uplink of each rack, the parallel links from one
edge switch to its aggregation switches. A bundle of ``width`` parallel links is assumed
evenly loaded (ECMP), so each of its links carries ``bytes / width``.

* ``switch``: every host on one switch.
* ``racks:count=R,uplink=RATE``: hosts numbered rack by rack, each rack a switch, racks
  joined through a spine by one link per rack in each direction (the emulated two-level
  network of ``commpress cluster up --racks``).
* ``fattree:radix=K``: the three-level fat tree of K-port switches: K pods of K/2 edge and
  K/2 aggregation switches, K/2 hosts per edge switch, (K/2)^2 core switches; full
  bisection, every link at the host link's rate. Hosts fill edge switches in order.

The ranks of a call run one per host, rank r on host r, unless the topology is
:meth:`~Topology.placed` on other hosts (a subgroup: rank r on the host of its global
rank).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np

from commpress.spec_options import parse_options, split_spec
from commpress.units import parse_rate_bits

WAYS = ("up", "down")


@dataclasses.dataclass(frozen=True)
class Level:
    name: str
    bundles: int  # entries in the level's arrays
    width: int  # parallel links per bundle
    rate_bits: float  # of one link


class Topology:
    """Where ``nodes`` hosts sit; subclasses say which links a flow or broadcast crosses.
    ``hosts``: the host each rank of a call runs on (every host, in order, unless
    :meth:`placed`)."""

    name = ""

    def __init__(self, nodes: int, link_bits: float):
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 2:
            raise ValueError(f"nodes must be an int of at least 2, got {nodes!r}")
        self.nodes, self.link_bits = nodes, _rate(link_bits, "link rate")
        self.hosts = np.arange(nodes)

    @property
    def ranks(self) -> int:
        """The ranks of a call on this topology: one per host it is placed on."""
        return len(self.hosts)

    def placed(self, hosts) -> Topology:
        """The same network with a call's ranks on ``hosts`` (rank r on ``hosts[r]``), such
        as a subgroup's global ranks."""
        hosts = np.asarray(hosts, dtype=np.int64)
        distinct = len(np.unique(hosts)) == len(hosts)
        if hosts.ndim != 1 or len(hosts) < 2 or not distinct:
            raise ValueError(f"hosts must be two or more distinct hosts, got {hosts.tolist()}")
        if hosts.min() < 0 or hosts.max() >= self.nodes:
            raise ValueError(f"hosts {hosts.tolist()} are not all among the {self.nodes} hosts")
        placed = copy.copy(self)
        placed.hosts = hosts
        return placed

    def levels(self) -> list[Level]:
        n = self.nodes
        return [Level("host up", n, 1, self.link_bits), Level("host down", n, 1, self.link_bits)]

    def flow_bytes(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> dict:
        """Bytes per bundle of every level, for unicast flows ``src -> dst``."""
        n = self.nodes
        return {
            "host up": np.bincount(src, nbytes, n),
            "host down": np.bincount(dst, nbytes, n),
        }

    def broadcast_bytes(self, nbytes: float) -> dict:
        """Bytes per bundle of every level when every rank's host broadcasts ``nbytes`` to
        the others once (a multicast all-gather): each tree link carries each root's
        payload once."""
        up, down = np.zeros(self.nodes), np.zeros(self.nodes)
        up[self.hosts], down[self.hosts] = nbytes, (self.ranks - 1) * nbytes
        return {"host up": up, "host down": down}

    def longest_path(self) -> int:
        """Links on the longest path between two of the ranks' hosts."""
        return 2

    def __str__(self) -> str:
        return self.name


class Switch(Topology):
    name = "switch"


class Racks(Topology):
    def __init__(self, nodes: int, link_bits: float, count: int, uplink_bits: float):
        super().__init__(nodes, link_bits)
        if count < 2 or count > nodes:
            raise ValueError(f"racks: count must be in [2, nodes={nodes}], got {count}")
        self.count, self.uplink_bits = count, _rate(uplink_bits, "racks uplink")
        self.rack = self.hosts * count // nodes  # rack by rack, as the emulated cluster
        self.name = f"racks:count={count},uplink={_rate_text(uplink_bits)}"

    def levels(self) -> list[Level]:
        uplinks = [
            Level(f"uplink {way}", self.count, 1, self.uplink_bits) for way in ("up", "down")
        ]
        return super().levels() + uplinks

    def flow_bytes(self, src, dst, nbytes) -> dict:
        loads = super().flow_bytes(src, dst, nbytes)
        loads["uplink up"], loads["uplink down"] = _leaving(self.rack, self.count, src, dst, nbytes)
        return loads

    def broadcast_bytes(self, nbytes: float) -> dict:
        loads = super().broadcast_bytes(nbytes)
        loads["uplink up"], loads["uplink down"] = _tree(self.rack[self.hosts], self.count, nbytes)
        return loads

    def longest_path(self) -> int:
        return 4 if _spans(self.rack[self.hosts]) else 2


class FatTree(Topology):
    def __init__(self, nodes: int, link_bits: float, radix: int):
        super().__init__(nodes, link_bits)
        if radix < 4 or radix % 2:
            raise ValueError(f"fattree: radix must be an even number of at least 4, got {radix}")
        capacity = radix**3 // 4
        if nodes > capacity:
            raise ValueError(f"fattree:radix={radix} holds {capacity} hosts, asked for {nodes}")
        self.radix, half = radix, radix // 2
        self.edge = self.hosts // half
        self.pod = self.hosts // (half * half)
        self.edges, self.pods = int(self.edge[-1]) + 1, int(self.pod[-1]) + 1
        self.name = f"fattree:radix={radix}"

    def levels(self) -> list[Level]:
        half, rate = self.radix // 2, self.link_bits
        return super().levels() + [
            Level("edge up", self.edges, half, rate),
            Level("edge down", self.edges, half, rate),
            Level("core up", self.pods, half * half, rate),
            Level("core down", self.pods, half * half, rate),
        ]

    def flow_bytes(self, src, dst, nbytes) -> dict:
        loads = super().flow_bytes(src, dst, nbytes)
        loads["edge up"], loads["edge down"] = _leaving(self.edge, self.edges, src, dst, nbytes)
        loads["core up"], loads["core down"] = _leaving(self.pod, self.pods, src, dst, nbytes)
        return loads

    def broadcast_bytes(self, nbytes: float) -> dict:
        loads = super().broadcast_bytes(nbytes)
        loads["edge up"], loads["edge down"] = _tree(self.edge[self.hosts], self.edges, nbytes)
        loads["core up"], loads["core down"] = _tree(self.pod[self.hosts], self.pods, nbytes)
        return loads

    def longest_path(self) -> int:
        return 6 if _spans(self.pod[self.hosts]) else 4 if _spans(self.edge[self.hosts]) else 2


def _spans(group: np.ndarray) -> bool:
    """Whether the ranks' hosts sit in more than one group (rack, edge switch, pod)."""
    return len(np.unique(group)) > 1


def _leaving(group: np.ndarray, count: int, src, dst, nbytes) -> tuple[np.ndarray, ...]:
    """Bytes out of and into each of ``count`` groups (racks, edge switches, pods) of
    the flows whose ends are in different groups (``group[host]``)."""
    across = group[src] != group[dst]
    up = np.bincount(group[src][across], nbytes[across], count)
    return up, np.bincount(group[dst][across], nbytes[across], count)


def _tree(group: np.ndarray, count: int, nbytes: float) -> tuple[np.ndarray, ...]:
    """Bytes out of and into each group when every root (``group``: the group of each)
    broadcasts ``nbytes``: each root's payload leaves its group once, where another
    group holds a rank, and enters every other group that holds one once."""
    roots = np.bincount(group, minlength=count)
    members = roots > 0
    if members.sum() < 2:
        return np.zeros(count), np.zeros(count)
    return roots * nbytes, np.where(members, len(group) - roots, 0) * nbytes


def parse_topology(text: str, nodes: int, link_bits: float) -> Topology:
    """``switch``, ``racks:count=2,uplink=500mbit``, ``fattree:radix=32``."""
    kind, options = check_topology(text)
    if kind == "switch":
        return Switch(nodes, link_bits)
    if kind == "racks":
        uplink = options.get("uplink")
        uplink_bits = link_bits if uplink is None else parse_rate_bits(uplink, "racks uplink")
        return Racks(nodes, link_bits, options["count"], uplink_bits)
    return FatTree(nodes, link_bits, options["radix"])


def check_topology(text: str) -> tuple[str, dict]:
    """``(kind, options)`` of a topology spec, whatever the node count; ValueError naming
    what is wrong."""
    if not isinstance(text, str):
        raise TypeError(f"topology must be a string, got {text!r}")
    kind, rest = split_spec(text)
    known = {"switch": {}, "racks": {"count": int, "uplink": str}, "fattree": {"radix": int}}
    if kind not in known:
        raise ValueError(f"unknown topology {kind!r}; known: switch, racks:count=R,uplink=RATE, "
                         "fattree:radix=K")  # fmt: skip
    options = parse_options(rest, known[kind], text, f"topology {kind!r}")
    if kind == "racks":
        options.setdefault("count", 2)
        if options["count"] < 2:
            raise ValueError(f"{text!r}: count must be at least 2 (one rack is 'switch')")
        if "uplink" in options:
            parse_rate_bits(options["uplink"], "racks uplink")
    elif kind == "fattree":
        if "radix" not in options:
            raise ValueError(f"topology {text!r} needs radix=")
        if options["radix"] < 4 or options["radix"] % 2:
            raise ValueError(f"{text!r}: radix must be an even number of at least 4")
    return kind, options


def _rate(bits, what: str) -> float:
    """``bits`` per second as a float, positive and finite (a rate of 400 digits is not)."""
    try:
        rate = float(bits)
    except OverflowError:
        rate = math.inf
    if not 0 < rate < math.inf:  # NaN too
        raise ValueError(f"{what} must be positive and below 1e308 bit/s, got {rate:g} bit/s")
    return rate


def _rate_text(bits: float) -> str:
    for unit, size in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= size and bits % size == 0:
            return f"{int(bits // size)}{unit}"
    return f"{int(bits)}bit"
