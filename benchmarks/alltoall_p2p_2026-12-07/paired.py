"""The ``alltoall`` reduce-scatter on gloo: its all-to-all posted as point-to-point sends
and receives (receives first), against gloo's own ``all_to_all_single``, and the library's
choice between the two by payload size, interleaved call by call in the same rounds.

``python benchmarks/alltoall_p2p_2026-12-07/paired.py HOSTS ROUNDS SIZE...`` (root;
HOSTS emulated hosts at 1 Gbit/s, MTU 1500, prefix ``cpaa``). SIZE: bytes of the fp32
reduce-scatter input. Variants, each timed as the slowest rank's seconds per call, their
order rotated round by round, 3 warm-up rounds not kept:

* ``alltoall CODEC chosen``: ``cp.reduce_scatter_tensor(..., codec=CODEC,
  algorithm="alltoall")`` as it runs by default (point to point from
  ``commpress.collectives.executor.ALL_TO_ALL_BY_POINT_TO_POINT_FROM_BYTES`` per peer);
* ``alltoall CODEC p2p``: the same call, point to point at every size (that threshold 0);
* ``alltoall CODEC gloo``: the same call through gloo's all-to-all at every size (None;
  as before this change);
* ``ring CODEC``: the ring reduce-scatter, and ``native``: torch's own reduce-scatter of
  the fp32 tensor, for reference.

Prints each variant's median and quartiles (ms) and, per codec, the median over rounds of
the per-round ratios gloo / p2p and gloo / chosen with 95% bootstrap intervals.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist

import commpress as cp
from commpress.bench.paired import interleaved_calls, paired_ratio
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.collectives import executor

CODECS = ("none", "int8")
#: each variant's ALL_TO_ALL_BY_POINT_TO_POINT_FROM_BYTES
THRESHOLDS = {"chosen": executor.ALL_TO_ALL_BY_POINT_TO_POINT_FROM_BYTES, "p2p": 0, "gloo": None}
WARMUP = 3


def _variants() -> list[str]:
    return [f"alltoall {c} {t}" for c in CODECS for t in THRESHOLDS] + [
        *(f"ring {c}" for c in CODECS),
        "native",
    ]


def _calls(size: int, world_size: int) -> dict:
    numel = size // 4 // world_size * world_size
    inp, out = torch.randn(numel), torch.empty(numel // world_size)

    def alltoall(codec: str, threshold: int | None):
        def call():
            executor.ALL_TO_ALL_BY_POINT_TO_POINT_FROM_BYTES = threshold
            try:
                cp.reduce_scatter_tensor(out, inp, codec=codec, algorithm="alltoall")
            finally:
                executor.ALL_TO_ALL_BY_POINT_TO_POINT_FROM_BYTES = THRESHOLDS["chosen"]

        return call

    calls = {}
    for codec in CODECS:
        for name, threshold in THRESHOLDS.items():
            calls[f"alltoall {codec} {name}"] = alltoall(codec, threshold)
        calls[f"ring {codec}"] = lambda codec=codec: cp.reduce_scatter_tensor(
            out, inp, codec=codec, algorithm="ring"
        )
    calls["native"] = lambda: dist.reduce_scatter_tensor(out, inp)
    return {variant: calls[variant] for variant in _variants()}


def worker(rank, world_size, sizes, rounds):
    return {size: interleaved_calls(_calls(size, world_size), rounds, WARMUP) for size in sizes}


def main() -> None:
    hosts, rounds = int(sys.argv[1]), int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    with cluster_for(hosts, "1gbit", prefix="cpaa") as cluster:
        results = cluster.run(worker, sizes, rounds, timeout=3600)[0]
    print(f"{hosts} hosts at 1 Gbit/s, {rounds} rounds, the slowest rank's ms per call")
    print("| input (B) | variant | median | p25 | p75 |")
    print("|---:|---|---:|---:|---:|")
    for size, times in results.items():
        for variant in _variants():
            q = statistics.quantiles([t * 1e3 for t in times[variant]], n=4)
            print(f"| {size} | {variant} | {q[1]:.2f} | {q[0]:.2f} | {q[2]:.2f} |")
    print("\nMedians over rounds of the per-round ratios (95% bootstrap intervals):\n")
    print("| input (B) | codec | gloo / p2p | gloo / chosen |")
    print("|---:|---|---:|---:|")
    for size, times in results.items():
        for codec in CODECS:
            gloo = times[f"alltoall {codec} gloo"]
            cells = []
            for other in ("p2p", "chosen"):
                middle, low, high = paired_ratio(gloo, times[f"alltoall {codec} {other}"])
                cells.append(f"{middle:.2f} ({low:.2f}-{high:.2f})")
            print(f"| {size} | {codec} | {' | '.join(cells)} |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
