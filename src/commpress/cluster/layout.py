"""Names and addresses of an emulated cluster: the one place they come from.

Host ``i`` is the network namespace ``<prefix>-h<i>`` with interface ``eth0`` at
``10.213.0.<i+1>/24``; its link's other end, ``<prefix>-s<i>``, is a port of the
bridge ``<prefix>-br`` (the switch). The bridge has no address, so the hosts can
reach each other and nothing else.

With racks, ``<prefix>-br`` is the spine and rack ``k`` is the bridge ``<prefix>-r<k>``,
the switch of its hosts' ports; the rack joins the spine through the veth pair
``<prefix>-u<k>`` (a port of the rack's bridge) and ``<prefix>-d<k>`` (a port of the
spine). Hosts are numbered rack by rack, and all share one /24 (one L2 domain).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_HOSTS = 254  # host addresses .1 to .254 of one /24
MULTICAST_ROUTE = "224.0.0.0/4"
_PREFIX = re.compile(r"[a-z][a-z0-9]{0,5}")
#: The name of a cluster when none is given.
DEFAULT_PREFIX = "cp"


@dataclass(frozen=True)
class Layout:
    prefix: str = DEFAULT_PREFIX
    subnet: str = "10.213.0"
    interface: str = "eth0"
    prefix_length: int = 24

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not _PREFIX.fullmatch(self.prefix):
            raise ValueError(
                f"prefix must be 1-6 lowercase letters or digits starting with a letter, "
                f"got {self.prefix!r}"
            )

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    def namespace(self, host: int) -> str:
        return f"{self.prefix}-h{host}"

    def switch_port(self, host: int) -> str:
        return f"{self.prefix}-s{host}"

    def rack_bridge(self, rack: int) -> str:
        """The switch of rack ``rack``'s hosts (with one rack there is none: ``bridge``)."""
        return f"{self.prefix}-r{rack}"

    def uplink_port(self, rack: int) -> str:
        """The rack's end of its uplink, a port of its bridge: it sends what goes up."""
        return f"{self.prefix}-u{rack}"

    def spine_port(self, rack: int) -> str:
        """The spine's end of rack ``rack``'s uplink: it sends what goes down to the rack."""
        return f"{self.prefix}-d{rack}"

    def address(self, host: int) -> str:
        return f"{self.subnet}.{host + 1}"

    def host_of(self, namespace: str) -> int | None:
        """The host index of one of this layout's namespaces, None for any other name."""
        match = re.fullmatch(rf"{re.escape(self.prefix)}-h(\d+)", namespace)
        return int(match.group(1)) if match else None

    def host_of_port(self, name: str) -> int | None:
        """The host index of one of this layout's switch ports, None for any other name."""
        match = re.fullmatch(rf"{re.escape(self.prefix)}-s(\d+)", name)
        return int(match.group(1)) if match else None

    def rack_of_bridge(self, name: str) -> int | None:
        """The rack index of one of this layout's rack bridges, None for any other name."""
        match = re.fullmatch(rf"{re.escape(self.prefix)}-r(\d+)", name)
        return int(match.group(1)) if match else None

    def rack_of_link(self, name: str) -> int | None:
        """The rack index of a rack bridge or either end of its uplink, None for any other
        name."""
        match = re.fullmatch(rf"{re.escape(self.prefix)}-[rud](\d+)", name)
        return int(match.group(1)) if match else None

    def owns_link(self, name: str) -> bool:
        """Whether ``name`` is one of this layout's links in the root namespace: the bridge,
        a host's switch port, a rack bridge or either end of an uplink."""
        return name == self.bridge or bool(
            re.fullmatch(rf"{re.escape(self.prefix)}-[srud]\d+", name)
        )


def check_hosts(hosts) -> int:
    if isinstance(hosts, bool) or not isinstance(hosts, int):
        raise TypeError(f"hosts must be an int, got {type(hosts).__name__}")
    if not 1 <= hosts <= MAX_HOSTS:
        raise ValueError(f"hosts must be between 1 and {MAX_HOSTS}, got {hosts}")
    return hosts
