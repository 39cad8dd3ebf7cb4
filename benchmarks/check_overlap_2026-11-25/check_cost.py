"""What the argument check costs a compressed collective, on the emulated cluster.

``python benchmarks/check_overlap_2026-11-25/check_cost.py HOSTS ITERS SIZE... [ALGORITHM]``
(root, ALGORITHM ``ring`` unless given;
builds HOSTS hosts at 1 Gbit/s, prefix ``cpck``). For each size (bytes of the all-gather
output and of the reduce-scatter input, fp32, as nccl-tests), the int8 all-gather and
reduce-scatter run in four variants, interleaved call by call in the same processes, the
order of the four rotated from one round to the next (the position in a round biases a
call's time on this machine by as much as the check is suspected to cost):

* ``check``: as the library runs it at the commit measured (from ``ba56f87`` on gloo: in
  band, a header on each message, ``commpress/collectives/inband.py``; at ``74c097e``: one
  all-reduce of the digests, the first ring send before its verdict, the first receive
  after it);
* ``nocheck``: no fingerprint at all;
* ``nocheck-again``: the same as ``nocheck``, measured as a variant of its own: how far
  two runs of the same code differ here, the yardstick for "not visible";
* ``one-message``: no check, but one 128-byte message to the right neighbour per call,
  posted first and awaited last: what any check that sends a message costs at least.

Prints, per op and size, the median over calls of the slowest rank's time per variant,
and the median of the paired differences ``check - nocheck`` and ``nocheck-again -
nocheck`` (the variants of one round run back to back) with a 95% bootstrap interval of
that median: an interval that straddles zero is a cost this machine cannot tell from none.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist

import commpress as cp
from commpress.bench.paired import interleaved_rounds, paired_difference
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.collectives import all_gather, reduce_scatter
from commpress.transport import p2p

VARIANTS = ("check", "nocheck", "nocheck-again", "one-message")
WARMUP = 3


def _variant(name: str):
    """Patch the library into variant ``name``; returns the undo."""
    executes = {module: module.execute for module in (all_gather, reduce_scatter)}

    def without_check(real, message: bool):
        def execute(schedule, payloads, group, timeout, fingerprint=None, window=None):
            rank, world_size = dist.get_rank(group), dist.get_world_size(group)
            row, received = torch.zeros(128, dtype=torch.uint8), torch.empty(128, dtype=torch.uint8)
            right, left = (rank + 1) % world_size, (rank - 1) % world_size
            one = p2p.Batch(group, [(row, right)], [(received, left)]) if message else None
            real(schedule, payloads, group, timeout, None, window)
            if one is not None:
                one.wait()

        return execute

    if name in ("nocheck", "nocheck-again", "one-message"):
        for module, real in executes.items():
            module.execute = without_check(real, name == "one-message")

    def undo():
        for module, real in executes.items():
            module.execute = real

    return undo


def _call(op: str, size: int, world_size: int, algorithm: str):
    if op == "all_gather":
        inp, out = torch.randn(size // 4 // world_size), torch.empty(size // 4)
        return lambda: cp.all_gather_into_tensor(out, inp, codec="int8", algorithm=algorithm)
    inp, out = torch.randn(size // 4), torch.empty(size // 4 // world_size)
    reduce_algorithm = "alltoall" if algorithm == "backend" else algorithm
    return lambda: cp.reduce_scatter_tensor(out, inp, codec="int8", algorithm=reduce_algorithm)


def worker(rank, world_size, sizes, iterations, algorithm):
    results = {}
    for size in sizes:
        for op in ("all_gather", "reduce_scatter"):
            call = _call(op, size, world_size, algorithm)
            times = interleaved_rounds(call, VARIANTS, iterations, _variant, WARMUP)
            results[(op, size)] = times
    return results


def main() -> None:
    hosts, iterations = int(sys.argv[1]), int(sys.argv[2])
    algorithm = sys.argv[-1] if not sys.argv[-1].isdigit() else "ring"
    sizes = [int(s) for s in sys.argv[3:] if s.isdigit()]
    with cluster_for(hosts, "1gbit", prefix="cpck") as cluster:
        results = cluster.run(worker, sizes, iterations, algorithm, timeout=1800)[0]
    print(
        f"{hosts} hosts at 1 Gbit/s, int8 {algorithm} (reduce-scatter: alltoall for backend), "
        f"median of {iterations} interleaved calls (ms)"
    )
    print(
        "| op | size (B) | "
        + " | ".join(VARIANTS)
        + " | check vs nocheck | paired check - nocheck (ms, 95% interval)"
        + " | paired nocheck-again - nocheck |"
    )
    print("|---|---:|" + "---:|" * len(VARIANTS) + "---:|---:|---:|")
    for (op, size), times in results.items():
        row = {v: statistics.median(t) for v, t in times.items()}
        cost = row["check"] / row["nocheck"] - 1
        cells = " | ".join(f"{row[v] * 1e3:.2f}" for v in VARIANTS)
        paired = [
            "{:+.2f} ({:+.2f} to {:+.2f})".format(
                *(1e3 * t for t in paired_difference(times[v], base))
            )
            for v, base in (("check", times["nocheck"]), ("nocheck-again", times["nocheck"]))
        ]
        print(f"| {op} | {size} | {cells} | {cost:+.1%} | {paired[0]} | {paired[1]} |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
