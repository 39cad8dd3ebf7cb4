"""Does handling the last piece of a ring round before the next round starts (the order of
the code before the executor) make the reduce-scatter faster on this machine?

``python benchmarks/schedules_2026-11-25/round_order.py HOSTS SIZE ROUNDS CODEC`` (root): both
orders run interleaved in one process on an emulated cluster (1 Gbit/s, prefix ``cpro``);
medians of the slowest rank's time per call, in ms.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

import commpress as cp
from commpress.collectives import executor, reduce_scatter
from commpress.collectives.fingerprint import Agreement


def _check(group, fingerprint, timeout, device) -> None:
    if fingerprint is not None:  # its cost is measured apart: `fixed_cost.py`
        Agreement(group, fingerprint, timeout, device).check()


def _old_order(schedule, payloads, group, timeout, fingerprint=None, window=None):
    """The executor's loop, but every arrival is handled before a new round's first step
    is posted (window 1), as the hand-written ring did."""
    _check(group, fingerprint, timeout, payloads.device)
    for step in schedule.steps:
        for send in step.sends:
            if send.prepare is executor.Prepare.ENCODE:
                payloads.encode_own(send)
    payloads.begin()
    arrived, previous = [], None
    for step in schedule.steps:
        if step.round != previous:
            for receive in arrived:
                payloads.handle(receive)
            arrived = []
        previous = step.round
        forwarded = {(s.chunk, s.piece) for s in step.sends}
        for receive in [r for r in arrived if (r.chunk, r.piece) in forwarded]:
            payloads.handle(receive)
        arrived = [r for r in arrived if (r.chunk, r.piece) not in forwarded]
        transfer = executor._start(schedule.transport, step, payloads, group)
        for receive in arrived:
            payloads.handle(receive)
        transfer.wait(timeout)
        arrived = list(step.receives)
    for receive in arrived:
        payloads.handle(receive)


def _new_order(schedule, payloads, group, timeout, fingerprint=None, window=None):
    _check(group, fingerprint, timeout, payloads.device)
    executor.execute(schedule, payloads, group, timeout, None, window)


def worker(rank, world_size, size, rounds, codec):
    numel = size // 4
    inp = torch.randn(numel)
    out = torch.empty(numel // world_size)
    variants = {"executor": _new_order, "old order": _old_order}
    times = {name: [] for name in variants}
    for index in range(rounds + 1):
        for name, execute in variants.items():
            reduce_scatter.execute = execute
            dist.barrier()
            start = time.perf_counter()
            cp.reduce_scatter_tensor(out, inp, codec=codec)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if index:
                times[name].append(elapsed.item())
    return {name: statistics.median(t) for name, t in times.items()}


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import round_order

    from commpress.cluster import cluster_for

    hosts, size, rounds, codec = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with cluster_for(hosts, "1gbit", prefix="cpro") as cluster:
        result = cluster.run(round_order.worker, size, rounds, codec, timeout=900)[0]
    print({name: round(seconds * 1e3, 1) for name, seconds in result.items()})
