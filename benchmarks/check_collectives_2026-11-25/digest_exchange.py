"""What the argument check's one collective costs, by collective, on the emulated cluster.

``python benchmarks/check_collectives_2026-11-25/digest_exchange.py HOSTS ITERS`` (root;
builds HOSTS hosts at 1 Gbit/s, prefix ``cpdx``). Every rank's 63-bit digest, exchanged
as the check does it today (an all-reduce of [d, -d] with MAX) and as an all-gather of
the digests (gloo's ring: n - 1 steps instead of the all-reduce's), each call timed on
every rank; the variants run interleaved, one call each per round. Prints, per variant,
the median over calls of the slowest rank's time.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script


def _all_reduce(rank, world_size):
    digests = torch.tensor([rank, -rank], dtype=torch.int64)
    dist.all_reduce(digests, dist.ReduceOp.MAX)


def _all_gather(rank, world_size):
    out = torch.empty(world_size, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.tensor([rank], dtype=torch.int64))


VARIANTS = {"all-reduce [d, -d] MAX": _all_reduce, "all-gather d": _all_gather}


def worker(rank, world_size, iterations):
    times = {name: [] for name in VARIANTS}
    for round_ in range(iterations + 5):
        for name, call in VARIANTS.items():
            dist.barrier()
            start = time.perf_counter()
            call(rank, world_size)
            if round_ >= 5:
                times[name].append(time.perf_counter() - start)
    return times


def main(hosts: int, iterations: int) -> None:
    with cluster_for(hosts, "1gbit", prefix="cpdx") as cluster:
        by_rank = cluster.run(worker, iterations, timeout=900)
    print(f"{hosts} hosts, 1 Gbit/s, median of {iterations} interleaved calls (slowest rank)")
    for name in VARIANTS:
        slowest = [max(rows[name][i] for rows in by_rank) for i in range(iterations)]
        print(f"{name}: {statistics.median(slowest) * 1e3:.3f} ms")


if __name__ == "__main__":  # the hosts unpickle `worker` from this module, not __main__
    main_of_script(__file__, int(sys.argv[1]), int(sys.argv[2]))
