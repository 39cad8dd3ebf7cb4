"""Datagrams each host's kernel dropped for a full socket receive buffer during multicast
all-gathers: ``python drops.py HOSTS MIB [CALLS]`` (root; 1 Gbit/s links, prefix ``cpdr``).

Reads the ``Udp: RcvbufErrors`` counter of ``/proc/net/snmp`` in each host's namespace
before and after the calls; prints each rank's time per call and each host's drops (each
a read of one datagram or of several coalesced, as UDP_GRO hands them up).
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster import Emulated
from commpress.transport import multicast


def calls(rank: int, world_size: int, mib: int, count: int) -> list[float]:
    numel = mib * 2**20 // 4 // world_size
    shard, out = torch.randn(numel), torch.empty(numel * world_size)
    multicast.configure(dist.group.WORLD, rate_bits=10**9)
    times = []
    for _ in range(count):
        dist.barrier()
        start = time.perf_counter()
        cp.all_gather_into_tensor(out, shard, codec="none", algorithm="multicast")
        times.append(time.perf_counter() - start)
    return times


def udp_counters(namespace: str) -> dict[str, int]:
    text = subprocess.run(
        ["ip", "netns", "exec", namespace, "cat", "/proc/net/snmp"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    names, values = [line.split()[1:] for line in text.splitlines() if line.startswith("Udp:")]
    return dict(zip(names, map(int, values), strict=True))


def main(hosts: int, mib: int, count: int) -> None:
    with Emulated(hosts=hosts, link="1gbit", prefix="cpdr") as cluster:
        before = {ns: udp_counters(ns) for ns in cluster.namespaces}
        for rank, times in enumerate(cluster.run(calls, mib, count)):
            print(f"rank {rank} ms per call:", " ".join(f"{t * 1e3:.1f}" for t in times))
        for namespace in cluster.namespaces:
            after = udp_counters(namespace)
            drops = after["RcvbufErrors"] - before[namespace]["RcvbufErrors"]
            reads = after["InDatagrams"] - before[namespace]["InDatagrams"]
            print(f"{namespace}: {drops} receive-buffer drops, {reads} reads")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 4)
