"""The order in which a rank posts an all-to-all's point-to-point messages on gloo:
peers in ascending rank order (every rank sends to rank 0 first, then to rank 1, ...)
against peers in turn from the own rank (rank r sends to r + 1, r + 2, ... and receives
from r - 1, r - 2, ...), every receive before any send either way; interleaved call by
call in the same rounds.

``python benchmarks/alltoall_order_2026-12-07/paired.py HOSTS ROUNDS SIZE...`` (root;
HOSTS emulated hosts at 1 Gbit/s, MTU 1500, prefix ``cpao``). SIZE: bytes of the fp32
reduce-scatter input. Variants, each timed as the slowest rank's seconds per call, their
order rotated round by round, 3 warm-up rounds not kept:

* ``alltoall CODEC ascending``: ``cp.reduce_scatter_tensor(..., codec=CODEC,
  algorithm="alltoall")`` with ``commpress.collectives.executor.POSTS_IN_TURN`` False;
* ``alltoall CODEC in turn``: the same with it True;
* ``ring CODEC``: the ring reduce-scatter, for reference.

Prints each variant's median and quartiles (ms) and, per codec, the median over rounds of
the per-round ratio ascending / in turn with its 95% bootstrap interval. Every size must
reach ``POINT_TO_POINT_FROM_BYTES`` of payload per peer for the order to apply.
"""

from __future__ import annotations

import statistics
import sys

import torch

import commpress as cp
from commpress.bench.paired import interleaved_calls, paired_ratio
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.collectives import executor

CODECS = ("none", "int8")
ORDERS = {"ascending": False, "in turn": True}
WARMUP = 3


def _variants() -> list[str]:
    return [f"alltoall {c} {o}" for c in CODECS for o in ORDERS] + [f"ring {c}" for c in CODECS]


def _calls(size: int, world_size: int) -> dict:
    numel = size // 4 // world_size * world_size
    inp, out = torch.randn(numel), torch.empty(numel // world_size)

    def ordered(codec: str, in_turn: bool):
        def call():
            executor.POSTS_IN_TURN = in_turn
            try:
                cp.reduce_scatter_tensor(out, inp, codec=codec, algorithm="alltoall")
            finally:
                executor.POSTS_IN_TURN = True

        return call

    calls = {}
    for codec in CODECS:
        for name, in_turn in ORDERS.items():
            calls[f"alltoall {codec} {name}"] = ordered(codec, in_turn)
        calls[f"ring {codec}"] = lambda codec=codec: cp.reduce_scatter_tensor(
            out, inp, codec=codec, algorithm="ring"
        )
    return {variant: calls[variant] for variant in _variants()}


def worker(rank, world_size, sizes, rounds):
    return {size: interleaved_calls(_calls(size, world_size), rounds, WARMUP) for size in sizes}


def main() -> None:
    hosts, rounds, sizes = int(sys.argv[1]), int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    with cluster_for(hosts, "1gbit", prefix="cpao") as cluster:
        results = cluster.run(worker, sizes, rounds, timeout=3600)[0]
    print(f"{hosts} hosts at 1 Gbit/s, reduce_scatter, {rounds} rounds, the slowest rank's ms")
    print("| input (B) | variant | median | p25 | p75 |")
    print("|---:|---|---:|---:|---:|")
    for size, times in results.items():
        for variant in _variants():
            q = statistics.quantiles([t * 1e3 for t in times[variant]], n=4)
            print(f"| {size} | {variant} | {q[1]:.2f} | {q[0]:.2f} | {q[2]:.2f} |")
    print("\nMedians over rounds of the per-round ratio (95% bootstrap intervals):\n")
    print("| input (B) | codec | ascending / in turn |")
    print("|---:|---|---:|")
    for size, times in results.items():
        for codec in CODECS:
            ratio = paired_ratio(
                times[f"alltoall {codec} ascending"], times[f"alltoall {codec} in turn"]
            )
            print(f"| {size} | {codec} | {ratio[0]:.2f} ({ratio[1]:.2f}-{ratio[2]:.2f}) |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
