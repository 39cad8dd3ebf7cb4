"""What one tiny message costs on 4 emulated hosts at 1 Gbit/s: a call of each (from a
barrier, slowest rank) and ten in a row in one call, so that the barrier's skew is spread.

``python benchmarks/backend_large_2026-12-06/tiny_calls.py HOSTS ROUNDS`` (root)."""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist

from commpress.bench.paired import interleaved_calls
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script


def worker(rank, world_size, rounds):
    pair = torch.zeros(2, dtype=torch.int64)
    header, received = torch.zeros(64, dtype=torch.uint8), torch.empty(64, dtype=torch.uint8)
    gathered = torch.empty(64 * world_size, dtype=torch.uint8)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size

    def exchange():
        sent = dist.P2POp(dist.isend, header, right)
        for work in dist.batch_isend_irecv([sent, dist.P2POp(dist.irecv, received, left)]):
            work.wait()

    calls = {
        "all_reduce, 2 int64": lambda: dist.all_reduce(pair, op=dist.ReduceOp.MAX),
        "all_gather, 64 B a rank": lambda: dist.all_gather_into_tensor(gathered, header),
        "p2p, 64 B right and from the left": exchange,
        "nothing": lambda: None,
        "10 x all_reduce": lambda: [dist.all_reduce(pair, op=dist.ReduceOp.MAX) for _ in range(10)],
        "10 x p2p": lambda: [exchange() for _ in range(10)],
        "10 x all_gather": lambda: [
            dist.all_gather_into_tensor(gathered, header) for _ in range(10)
        ],
    }
    return interleaved_calls(calls, rounds)


def main() -> None:
    hosts, rounds = int(sys.argv[1]), int(sys.argv[2])
    with cluster_for(hosts, "1gbit", prefix="cptc") as cluster:
        times = cluster.run(worker, rounds, timeout=3600)[0]
    print(f"{hosts} hosts at 1 Gbit/s, {rounds} rounds (ms, slowest rank, medians)")
    for variant, spent in times.items():
        print(f"| {variant} | {1e3 * statistics.median(spent):.3f} |")


if __name__ == "__main__":
    sys.exit(main_of_script(__file__))
