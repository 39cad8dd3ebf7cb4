"""gloo's own collectives at the sizes an argument check and a small ``backend`` call use,
interleaved call by call.

``python benchmarks/backend_check_2026-12-06/tiny_collectives.py HOSTS ROUNDS LINK``
(root; HOSTS emulated hosts at LINK, e.g. ``1gbit``, prefix ``cptn``). Prints the median
and quartiles of the slowest rank's milliseconds per call.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist

from commpress.bench.paired import interleaved_calls
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script

VARIANTS = (
    "all_gather_into_tensor 8 B",
    "all_gather (list) 8 B",
    "all_reduce 16 B",
    "all_gather_into_tensor 64 KiB",
    "all_gather_into_tensor 256 KiB",
    "all_reduce 256 KiB",
    "broadcast 8 B",
)


def _calls(world_size: int) -> dict:
    one, gathered = torch.zeros(1, dtype=torch.int64), torch.empty(world_size, dtype=torch.int64)
    listed = [torch.empty(1, dtype=torch.int64) for _ in range(world_size)]
    pair = torch.zeros(2, dtype=torch.int64)
    small = torch.zeros(64 << 10, dtype=torch.uint8)
    small_out = torch.empty((64 << 10) * world_size, dtype=torch.uint8)
    large = torch.zeros(256 << 10, dtype=torch.uint8)
    large_out = torch.empty((256 << 10) * world_size, dtype=torch.uint8)
    floats = torch.zeros(64 << 10)
    return {
        VARIANTS[0]: lambda: dist.all_gather_into_tensor(gathered, one),
        VARIANTS[1]: lambda: dist.all_gather(listed, one),
        VARIANTS[2]: lambda: dist.all_reduce(pair),
        VARIANTS[3]: lambda: dist.all_gather_into_tensor(small_out, small),
        VARIANTS[4]: lambda: dist.all_gather_into_tensor(large_out, large),
        VARIANTS[5]: lambda: dist.all_reduce(floats),
        VARIANTS[6]: lambda: dist.broadcast(one, 0),
    }


def worker(rank, world_size, rounds):
    return interleaved_calls(_calls(world_size), rounds)


def main() -> None:
    hosts, rounds, link = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with cluster_for(hosts, link, prefix="cptn") as cluster:
        times = cluster.run(worker, rounds, timeout=600)[0]
    print(f"{hosts} hosts at {link}, {rounds} rounds, the slowest rank's ms per call")
    print("| call | median | p25 | p75 |")
    print("|---|---:|---:|---:|")
    for variant in VARIANTS:
        low, middle, high = statistics.quantiles([t * 1e3 for t in times[variant]], n=4)
        print(f"| {variant} | {middle:.2f} | {low:.2f} | {high:.2f} |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
