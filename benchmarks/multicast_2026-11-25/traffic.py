"""Bytes on every link of an all-gather, ring against multicast, read from the emulated
cluster's interface counters (every header included).

Per host: bytes sent (tx) and received (rx) on its link; per rack: bytes up and down its
uplink. Fabric bytes = every host link both ways + every uplink both ways: a ring sends
and receives (N - 1) shards per host, multicast sends one and receives N - 1, so the
host links carry 2(N - 1)/N times more for the ring; a rack-ordered ring carries N - 1
shards over each uplink direction, multicast N/2 (2 racks). Each figure is a job of 3
calls minus a job of 1 call, halved: process-group setup and teardown cancel out.

    python benchmarks/multicast_2026-11-25/traffic.py --hosts 8 --racks 2 --json PATH
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist

import commpress as cp
from commpress.bench.arguments import byte_size
from commpress.bench.report import provenance
from commpress.cluster import Emulated
from commpress.cluster.commands import multicast_options
from commpress.cluster.jobs import main_of_script
from commpress.transport import multicast


def _worker(rank, world_size, shard_bytes, algorithm, codec, calls, options):
    multicast.configure(None, multicast.Options(**options))
    inp = torch.randn(shard_bytes // 4, generator=torch.Generator().manual_seed(rank))
    out = torch.empty(world_size * inp.numel())
    for _ in range(calls):
        cp.all_gather_into_tensor(out, inp, codec=codec, algorithm=algorithm)
    dist.barrier()


def _per_call(cluster, shard_bytes, algorithm, codec) -> dict:
    snapshots = {}
    for calls in (1, 3):
        hosts, uplinks = cluster.counters(), cluster.uplink_counters()
        cluster.run(
            _worker, shard_bytes, algorithm, codec, calls, multicast_options(cluster), timeout=900
        )
        snapshots[calls] = (
            [after - before for after, before in zip(cluster.counters(), hosts, strict=True)],
            [a - b for a, b in zip(cluster.uplink_counters(), uplinks, strict=True)],
        )
    hosts = [a - b for a, b in zip(snapshots[3][0], snapshots[1][0], strict=True)]
    uplinks = [a - b for a, b in zip(snapshots[3][1], snapshots[1][1], strict=True)]
    host_tx = [c.tx_bytes / 2 for c in hosts]
    host_rx = [c.rx_bytes / 2 for c in hosts]
    up = [c.tx_bytes / 2 for c in uplinks]
    down = [c.rx_bytes / 2 for c in uplinks]
    return {
        "algorithm": algorithm,
        "codec": codec,
        "shard_bytes": shard_bytes,
        "tx_per_host": host_tx,
        "rx_per_host": host_rx,
        "tx_over_shard_max": max(host_tx) / shard_bytes,
        "uplink_up": up,
        "uplink_down": down,
        "fabric_bytes": sum(host_tx) + sum(host_rx) + sum(up) + sum(down),
        "host_link_bytes": sum(host_tx) + sum(host_rx),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--racks", type=int, default=2)
    parser.add_argument("--link", default="1gbit")
    parser.add_argument("--uplink", default="1gbit")
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--shard", type=byte_size, default=1 << 20)
    parser.add_argument("--codec", default="none")
    parser.add_argument("--prefix", default="mct")
    parser.add_argument("--json")
    args = parser.parse_args()
    with Emulated(
        args.hosts, args.link, racks=args.racks, uplink=args.uplink, mtu=args.mtu,
        prefix=args.prefix,
    ) as cluster:  # fmt: skip
        rows = [
            _per_call(cluster, args.shard, algorithm, args.codec)
            for algorithm in ("ring", "multicast")
        ]
        where = cluster.describe()
    n = args.hosts
    ring, mc = rows
    summary = {
        "fabric_ring_over_multicast": ring["fabric_bytes"] / mc["fabric_bytes"],
        "host_links_ring_over_multicast": ring["host_link_bytes"] / mc["host_link_bytes"],
        "predicted_host_links": 2 * (n - 1) / n,
    }
    print(f"# all-gather traffic per call, {where}, shard {args.shard} B, codec {args.codec}")
    for row in rows:
        print(
            f"{row['algorithm']:>9}: tx/host max {row['tx_over_shard_max']:.3f} shards, "
            f"uplinks up {[round(b / args.shard, 3) for b in row['uplink_up']]} shards, "
            f"down {[round(b / args.shard, 3) for b in row['uplink_down']]} shards, "
            f"fabric {row['fabric_bytes'] / args.shard:.2f} shards"
        )
    print(
        f"ring / multicast: fabric {summary['fabric_ring_over_multicast']:.3f}, host links "
        f"{summary['host_links_ring_over_multicast']:.3f} "
        f"(predicted 2(N-1)/N = {summary['predicted_host_links']:.3f})"
    )
    if args.json:
        with open(args.json, "w") as file:
            record = {"where": where, "provenance": provenance(), "rows": rows, **summary}
            json.dump(record, file, indent=2)
    return 0


if __name__ == "__main__":  # run from the module, so that the ranks can import _worker
    sys.exit(main_of_script(__file__))
