"""The ``alltoall`` reduce-scatter encoding each piece while the pieces before it are on
the wire, against encoding every piece before the first exchange (as before), interleaved
call by call in the same rounds.

``python benchmarks/alltoall_encodes_2026-12-07/paired.py HOSTS ROUNDS SIZE...`` (root;
HOSTS emulated hosts at 1 Gbit/s, MTU 1500, prefix ``cpae``). SIZE: bytes of the fp32
reduce-scatter input. Variants, each ``cp.reduce_scatter_tensor(..., codec=CODEC,
algorithm="alltoall")`` with the default ``chunk_bytes`` (2 MiB of fp32), timed as the
slowest rank's seconds per call, their order rotated round by round, 3 warm-up rounds not
kept:

* ``CODEC by step``: the library as it is (``executor._encodes_by_step``);
* ``CODEC first``: every piece encoded before the first exchange (``_encodes_by_step``
  answering False).

Prints each variant's median and quartiles (ms) and, per codec, the median over rounds of
the per-round ratios first / by step, with a 95% bootstrap interval.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable

import torch

import commpress as cp
from commpress.bench.paired import interleaved_calls, paired_ratio
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.collectives import executor

CODECS = ("none", "int8", "int4")
KINDS = ("by step", "first")
WARMUP = 3
BY_STEP = executor._encodes_by_step


def _never(schedule, payloads) -> bool:
    return False


def _calls(size: int, world_size: int) -> dict:
    numel = size // 4 // world_size * world_size
    inp, out = torch.randn(numel), torch.empty(numel // world_size)

    def alltoall(codec: str, by_step) -> Callable[[], None]:
        def call():
            executor._encodes_by_step = by_step
            try:
                cp.reduce_scatter_tensor(out, inp, codec=codec, algorithm="alltoall")
            finally:
                executor._encodes_by_step = BY_STEP

        return call

    return {
        f"{codec} {kind}": alltoall(codec, BY_STEP if kind == "by step" else _never)
        for codec in CODECS
        for kind in KINDS
    }


def worker(rank, world_size, sizes, rounds):
    return {size: interleaved_calls(_calls(size, world_size), rounds, WARMUP) for size in sizes}


def main() -> None:
    hosts, rounds, sizes = int(sys.argv[1]), int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    with cluster_for(hosts, "1gbit", prefix="cpae") as cluster:
        results = cluster.run(worker, sizes, rounds, timeout=3600)[0]
    print(f"{hosts} hosts at 1 Gbit/s, reduce_scatter alltoall, {rounds} rounds, slowest rank's ms")
    print("| input (B) | variant | median | p25 | p75 |")
    print("|---:|---|---:|---:|---:|")
    for size, times in results.items():
        for variant in times:
            q = statistics.quantiles([t * 1e3 for t in times[variant]], n=4)
            print(f"| {size} | {variant} | {q[1]:.2f} | {q[0]:.2f} | {q[2]:.2f} |")
    print("\nMedians over rounds of the per-round ratios (95% bootstrap intervals):\n")
    print("| input (B) | codec | first / by step |")
    print("|---:|---|---:|")
    for size, times in results.items():
        for codec in CODECS:
            middle, low, high = paired_ratio(times[f"{codec} first"], times[f"{codec} by step"])
            print(f"| {size} | {codec} | {middle:.2f} ({low:.2f}-{high:.2f}) |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
