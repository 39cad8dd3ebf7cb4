"""The ``alltoall`` reduce-scatter in pieces of ``chunk_bytes`` (a piece summed while the
next is on the wire) against whole slices in one exchange (as before), interleaved call
by call in the same rounds.

``python benchmarks/alltoall_pieces_2026-12-07/paired.py HOSTS ROUNDS SIZE...`` (root;
HOSTS emulated hosts at 1 Gbit/s, MTU 1500, prefix ``cpap``). SIZE: bytes of the fp32
reduce-scatter input. Variants, each timed as the slowest rank's seconds per call, their
order rotated round by round, 3 warm-up rounds not kept:

* ``alltoall CODEC whole``: ``cp.reduce_scatter_tensor(..., codec=CODEC,
  algorithm="alltoall", chunk_bytes=1 << 40)``: one piece per slice, one exchange;
* ``alltoall CODEC pieces``: the same with the default ``chunk_bytes`` (2 MiB of fp32),
  ``commpress.collectives.executor.PIECES_IN_FLIGHT`` exchanges in flight (2);
* ``alltoall CODEC pieces, one in flight``: the same with ``PIECES_IN_FLIGHT = 1``;
* ``ring CODEC``: the ring reduce-scatter, for reference.

Prints each variant's median and quartiles (ms) and, per codec, the medians over rounds
of the per-round ratios whole / pieces and whole / one in flight, with 95% bootstrap
intervals.
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
WHOLE = 1 << 40
WARMUP = 3
IN_FLIGHT = executor.PIECES_IN_FLIGHT


def _variants() -> list[str]:
    kinds = ("whole", "pieces", "pieces, one in flight")
    return [f"alltoall {c} {k}" for c in CODECS for k in kinds] + [f"ring {c}" for c in CODECS]


def _calls(size: int, world_size: int) -> dict:
    numel = size // 4 // world_size * world_size
    inp, out = torch.randn(numel), torch.empty(numel // world_size)

    def alltoall(codec: str, chunk_bytes: int, in_flight: int):
        def call():
            executor.PIECES_IN_FLIGHT = in_flight
            try:
                cp.reduce_scatter_tensor(
                    out, inp, codec=codec, algorithm="alltoall", chunk_bytes=chunk_bytes
                )
            finally:
                executor.PIECES_IN_FLIGHT = IN_FLIGHT

        return call

    calls = {}
    default = cp.collectives.DEFAULT_CHUNK_BYTES
    for codec in CODECS:
        calls[f"alltoall {codec} whole"] = alltoall(codec, WHOLE, IN_FLIGHT)
        calls[f"alltoall {codec} pieces"] = alltoall(codec, default, IN_FLIGHT)
        calls[f"alltoall {codec} pieces, one in flight"] = alltoall(codec, default, 1)
        calls[f"ring {codec}"] = lambda codec=codec: cp.reduce_scatter_tensor(
            out, inp, codec=codec, algorithm="ring"
        )
    return {variant: calls[variant] for variant in _variants()}


def worker(rank, world_size, sizes, rounds):
    return {size: interleaved_calls(_calls(size, world_size), rounds, WARMUP) for size in sizes}


def main() -> None:
    hosts, rounds, sizes = int(sys.argv[1]), int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    with cluster_for(hosts, "1gbit", prefix="cpap") as cluster:
        results = cluster.run(worker, sizes, rounds, timeout=3600)[0]
    print(f"{hosts} hosts at 1 Gbit/s, reduce_scatter, {rounds} rounds, the slowest rank's ms")
    print("| input (B) | variant | median | p25 | p75 |")
    print("|---:|---|---:|---:|---:|")
    for size, times in results.items():
        for variant in _variants():
            q = statistics.quantiles([t * 1e3 for t in times[variant]], n=4)
            print(f"| {size} | {variant} | {q[1]:.2f} | {q[0]:.2f} | {q[2]:.2f} |")
    print("\nMedians over rounds of the per-round ratios (95% bootstrap intervals):\n")
    print("| input (B) | codec | whole / pieces | whole / pieces, one in flight |")
    print("|---:|---|---:|---:|")
    for size, times in results.items():
        for codec in CODECS:
            whole = times[f"alltoall {codec} whole"]
            cells = []
            for kind in ("pieces", "pieces, one in flight"):
                middle, low, high = paired_ratio(whole, times[f"alltoall {codec} {kind}"])
                cells.append(f"{middle:.2f} ({low:.2f}-{high:.2f})")
            print(f"| {size} | {codec} | {' | '.join(cells)} |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
