"""What posting each send and receive straight on the gloo process group saves against
``torch.distributed.batch_isend_irecv``, in the library's collectives on the emulated
cluster.

``python benchmarks/p2p_post_2026-11-26/post_cost.py HOSTS ITERS SIZE...`` (root; HOSTS
hosts at 1 Gbit/s, prefix ``cppo``). For each size (bytes of the all-gather output and of
the reduce-scatter input, fp32, as nccl-tests), the int8 ``ring`` all-gather and
reduce-scatter, argument check on, run in two variants interleaved call by call, their
order alternating from one round to the next:

* ``direct``: the library as it is (``commpress.transport.p2p.post_each``);
* ``batched``: the same, every point-to-point batch posted through ``batch_isend_irecv``.

Prints each variant's median over calls of the slowest rank's time and the median of the
paired differences ``direct - batched`` with its 95% bootstrap interval.
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
from commpress.transport import p2p

VARIANTS = ("batched", "direct")  # in this order in the first round, as measured
WARMUP = 3


def _batched(group, sends, receives):
    def op(kind, tensor, peer):
        return dist.P2POp(kind, tensor, dist.get_global_rank(group, peer), group)

    ops = [op(dist.isend, t, p) for t, p in sends] + [op(dist.irecv, t, p) for t, p in receives]
    return dist.batch_isend_irecv(ops)


def _call(op: str, size: int, world_size: int):
    if op == "all_gather":
        inp, out = torch.randn(size // 4 // world_size), torch.empty(size // 4)
        return lambda: cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="ring")
    inp, out = torch.randn(size // 4), torch.empty(size // 4 // world_size)
    return lambda: cp.reduce_scatter_tensor(out, inp, codec="int8", algorithm="ring")


def worker(rank, world_size, sizes, iterations):
    direct = p2p.post_each

    def switch(variant: str):
        p2p.post_each = direct if variant == "direct" else _batched
        return lambda: setattr(p2p, "post_each", direct)

    results = {}
    for size in sizes:
        for op in ("all_gather", "reduce_scatter"):
            call = _call(op, size, world_size)
            results[(op, size)] = interleaved_rounds(call, VARIANTS, iterations, switch, WARMUP)
    return results


def main() -> None:
    hosts, iterations = int(sys.argv[1]), int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    with cluster_for(hosts, "1gbit", prefix="cppo") as cluster:
        results = cluster.run(worker, sizes, iterations, timeout=1800)[0]
    print(f"{hosts} hosts at 1 Gbit/s, int8 ring, check on, {iterations} rounds (ms)")
    print("| op | size (B) | direct | batched | paired direct - batched (95% interval) |")
    print("|---|---:|---:|---:|---:|")
    for (op, size), times in results.items():
        medians = [statistics.median(times[v]) * 1e3 for v in ("direct", "batched")]
        middle, low, high = (1e3 * t for t in paired_difference(times["direct"], times["batched"]))
        print(
            f"| {op} | {size} | {medians[0]:.2f} | {medians[1]:.2f} | "
            f"{middle:+.2f} ({low:+.2f} to {high:+.2f}) |"
        )


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
