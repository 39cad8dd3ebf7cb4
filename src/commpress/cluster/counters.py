"""Traffic counters: bytes and packets an interface sent and received.

Read from ``/proc/net/dev``, which shows the interfaces of the reading process's
network namespace; so a rank inside a host reads its own link with
:func:`read_local`, and the controller reads every host's with
``Emulated.counters()``. Counters count the bytes the kernel hands the interface,
headers included, but with segmentation offload one set of headers (Ethernet, IP, TCP)
per packet of up to 64 KiB, not per frame: the shaper's limit applies to every 1500-byte
frame's headers, so a link carries a few percent more than its counter says.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

PROC_NET_DEV = "/proc/net/dev"
PROC_NET_SNMP = "/proc/net/snmp"


@dataclass(frozen=True)
class Counters:
    rx_bytes: int = 0
    rx_packets: int = 0
    tx_bytes: int = 0
    tx_packets: int = 0

    def __sub__(self, earlier: Counters) -> Counters:
        return Counters(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
        )


def parse_net_dev(text: str, interface: str) -> Counters:
    """The counters of ``interface`` in the text of ``/proc/net/dev``."""
    for line in text.splitlines()[2:]:
        name, _, values = line.partition(":")
        if name.strip() == interface:
            numbers = [int(value) for value in values.split()]
            # receive: bytes packets errs drop fifo frame compressed multicast; then transmit
            return Counters(numbers[0], numbers[1], numbers[8], numbers[9])
    raise ValueError(f"interface {interface!r} is not in {PROC_NET_DEV}")


def read_local(interface: str) -> Counters:
    """Counters of ``interface`` in this process's own network namespace."""
    with open(PROC_NET_DEV) as table:
        return parse_net_dev(table.read(), interface)


def parse_retransmitted(text: str) -> int:
    """TCP segments sent again (``RetransSegs``) in the text of ``/proc/net/snmp``."""
    tcp = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp:")]
    names, values = tcp[0], tcp[1]
    return int(values[names.index("RetransSegs")])


def read_retransmitted() -> int:
    """TCP segments this process's network namespace has retransmitted so far: bytes an
    interface counts twice when a shaped link dropped them (many senders to one host)."""
    with open(PROC_NET_SNMP) as table:
        return parse_retransmitted(table.read())
