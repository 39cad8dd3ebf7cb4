"""Where an ``alltoall`` reduce-scatter's time goes on each rank: milliseconds per call
spent in each part, measured by wrapping the executor's parts in timers.

``python benchmarks/alltoall_p2p_2026-12-07/phases.py HOSTS SIZE CODEC`` (root; HOSTS
emulated hosts at 1 Gbit/s, prefix ``cpph``; SIZE: bytes of the fp32 input). 8 calls
after 2 not kept, each from a barrier. Parts: the argument check's header (``check
post``) and verdict (``check settle``); the encodes; the own contribution's fp32 copy
(``begin``, while the transfer is in flight); waiting for the point-to-point transfers
(``p2p wait``) or a collective (the check's all-reduce: ``collective wait``); each
received payload's decode and sum. The parts overlap only where the executor overlaps
them (``begin`` with the transfer); the rest add up to about the call, but for the
check's header, whose wait ``p2p wait`` counts and ``check settle`` includes, and its
verdict's all-reduce (``collective wait``, inside ``check settle`` too). The parts are
means over the calls, the call a median.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.collectives import inband, payloads
from commpress.transport import p2p

PARTS = (
    (inband.Check, "post_header", "check post"),
    (inband.Check, "settle", "check settle"),
    (payloads.Contributions, "encode_own", "encode"),
    (payloads.Contributions, "begin", "begin"),
    (p2p.Batch, "wait", "p2p wait"),
    (p2p.Pending, "wait", "collective wait"),
    (payloads.Contributions, "handle", "decode+sum"),
)
ROUNDS, WARMUP = 8, 2


def _timed(spent: dict, owner, name: str, label: str) -> None:
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def worker(rank, world_size, size, codec):
    spent = collections.defaultdict(float)
    for owner, name, label in PARTS:
        _timed(spent, owner, name, label)
    numel = size // 4 // world_size * world_size
    inp, out = torch.randn(numel), torch.empty(numel // world_size)
    calls = []
    for index in range(WARMUP + ROUNDS):
        if index == WARMUP:
            spent.clear()
        dist.barrier()
        start = time.perf_counter()
        cp.reduce_scatter_tensor(out, inp, codec=codec, algorithm="alltoall")
        if index >= WARMUP:
            calls.append(time.perf_counter() - start)
    return {label: spent[label] / ROUNDS * 1e3 for _, _, label in PARTS}, calls


def main() -> None:
    hosts, size, codec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with cluster_for(hosts, "1gbit", prefix="cpph") as cluster:
        results = cluster.run(worker, size, codec, timeout=600)
    labels = [label for _, _, label in PARTS]
    print(f"{hosts} hosts at 1 Gbit/s, {size} B of fp32 input, codec {codec}, ms per call")
    print("| rank | call (median) | " + " | ".join(labels) + " |")
    print("|---:|---:|" + "---:|" * len(labels))
    for rank, (spent, calls) in enumerate(results):
        cells = " | ".join(f"{spent[label]:.1f}" for label in labels)
        print(f"| {rank} | {statistics.median(calls) * 1e3:.1f} | {cells} |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
