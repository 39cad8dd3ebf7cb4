"""Where ranks run: processes on this machine (:mod:`commpress.cluster.local`), or hosts of an
emulated cluster in network namespaces, a bridge as the switch, rate-limited links; with
``racks``, a bridge per rack and the racks joined through a spine by rate-limited uplinks.

with commpress.cluster.Emulated(hosts=4, link="1gbit") as cluster:
    cluster.launch(["python", "train.py"])       # a multi-node job, torchrun-style
    before = cluster.counters()                   # traffic per host

with commpress.cluster.Emulated(8, "1gbit", racks=2, uplink="500mbit") as cluster:
    before = cluster.uplink_counters()            # traffic per rack uplink (up = tx)
"""

from commpress.cluster.counters import Counters, read_local, read_retransmitted
from commpress.cluster.emulated import Emulated, cluster_for, present, remove
from commpress.cluster.layout import Layout
from commpress.cluster.link import Link, parse_rate
from commpress.cluster.system import ClusterError

__all__ = [
    "ClusterError",
    "Counters",
    "Emulated",
    "Layout",
    "Link",
    "cluster_for",
    "parse_rate",
    "present",
    "read_local",
    "read_retransmitted",
    "remove",
]
