"""The ``alltoall`` reduce-scatter on gloo: its all-to-all posted as point-to-point sends
and receives (receives first), against gloo's own ``all_to_all_single``, and the library's
choice between the two by payload size, interleaved call by call in the same rounds; with
``all_gather`` first, the same for the ``backend`` all-gather (point to point on two ranks
only) against gloo's own all-gather.

``python benchmarks/alltoall_p2p_2026-12-07/paired.py [all_gather] HOSTS ROUNDS SIZE...``
(root; HOSTS emulated hosts at 1 Gbit/s, MTU 1500, prefix ``cpaa``). SIZE: bytes of the
fp32 reduce-scatter input, or all-gather output. Variants, each timed as the slowest
rank's seconds per call, their order rotated round by round, 3 warm-up rounds not kept:

* ``alltoall CODEC chosen``: ``cp.reduce_scatter_tensor(..., codec=CODEC,
  algorithm="alltoall")`` as it runs by default (point to point from
  ``commpress.collectives.executor.POINT_TO_POINT_FROM_BYTES`` per peer; named
  ``ALL_TO_ALL_BY_POINT_TO_POINT_FROM_BYTES`` at ``d593cc3``);
* ``alltoall CODEC p2p``: the same call, point to point at every size (that threshold 0);
* ``alltoall CODEC gloo``: the same call through gloo's all-to-all at every size (None;
  as before this change);
* ``ring CODEC``: the ring reduce-scatter, and ``native``: torch's own reduce-scatter of
  the fp32 tensor, for reference;
* with ``all_gather``: ``backend CODEC chosen|p2p|gloo``, ``ring CODEC`` and ``native``,
  the all-gather's.

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
#: op -> the algorithm whose transport the variants switch
ALGORITHM = {"reduce_scatter": "alltoall", "all_gather": "backend"}
#: each variant's POINT_TO_POINT_FROM_BYTES
THRESHOLDS = {"chosen": executor.POINT_TO_POINT_FROM_BYTES, "p2p": 0, "gloo": None}
WARMUP = 3


def _variants(op: str) -> list[str]:
    return [f"{ALGORITHM[op]} {c} {t}" for c in CODECS for t in THRESHOLDS] + [
        *(f"ring {c}" for c in CODECS),
        "native",
    ]


def _calls(op: str, size: int, world_size: int) -> dict:
    numel = size // 4 // world_size * world_size
    if op == "reduce_scatter":
        inp, out = torch.randn(numel), torch.empty(numel // world_size)
        compressed, native = cp.reduce_scatter_tensor, dist.reduce_scatter_tensor
    else:
        inp, out = torch.randn(numel // world_size), torch.empty(numel)
        compressed, native = cp.all_gather_into_tensor, dist.all_gather_into_tensor

    def switched(codec: str, threshold: int | None):
        def call():
            executor.POINT_TO_POINT_FROM_BYTES = threshold
            try:
                compressed(out, inp, codec=codec, algorithm=ALGORITHM[op])
            finally:
                executor.POINT_TO_POINT_FROM_BYTES = THRESHOLDS["chosen"]

        return call

    calls = {}
    for codec in CODECS:
        for name, threshold in THRESHOLDS.items():
            calls[f"{ALGORITHM[op]} {codec} {name}"] = switched(codec, threshold)
        calls[f"ring {codec}"] = lambda codec=codec: compressed(
            out, inp, codec=codec, algorithm="ring"
        )
    calls["native"] = lambda: native(out, inp)
    return {variant: calls[variant] for variant in _variants(op)}


def worker(rank, world_size, op, sizes, rounds):
    return {size: interleaved_calls(_calls(op, size, world_size), rounds, WARMUP) for size in sizes}


def main() -> None:
    arguments = sys.argv[1:]
    op = arguments.pop(0) if arguments[0] in ALGORITHM else "reduce_scatter"
    hosts, rounds, sizes = int(arguments[0]), int(arguments[1]), [int(s) for s in arguments[2:]]
    with cluster_for(hosts, "1gbit", prefix="cpaa") as cluster:
        results = cluster.run(worker, op, sizes, rounds, timeout=3600)[0]
    measured = "input" if op == "reduce_scatter" else "output"
    print(f"{hosts} hosts at 1 Gbit/s, {op}, {rounds} rounds, the slowest rank's ms per call")
    print(f"| {measured} (B) | variant | median | p25 | p75 |")
    print("|---:|---|---:|---:|---:|")
    for size, times in results.items():
        for variant in _variants(op):
            q = statistics.quantiles([t * 1e3 for t in times[variant]], n=4)
            print(f"| {size} | {variant} | {q[1]:.2f} | {q[0]:.2f} | {q[2]:.2f} |")
    print("\nMedians over rounds of the per-round ratios (95% bootstrap intervals):\n")
    print(f"| {measured} (B) | codec | gloo / p2p | gloo / chosen |")
    print("|---:|---|---:|---:|")
    for size, times in results.items():
        for codec in CODECS:
            gloo = times[f"{ALGORITHM[op]} {codec} gloo"]
            cells = []
            for other in ("p2p", "chosen"):
                middle, low, high = paired_ratio(gloo, times[f"{ALGORITHM[op]} {codec} {other}"])
                cells.append(f"{middle:.2f} ({low:.2f}-{high:.2f})")
            print(f"| {size} | {codec} | {' | '.join(cells)} |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
