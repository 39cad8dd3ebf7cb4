"""One variant of ``floors.py`` called again and again on the emulated cluster, so that a
system-wide profiler can sample where the CPU time of a small all-gather goes.

``python benchmarks/small_messages_2026-11-26/busy_loop.py VARIANT SECONDS [SIZE]`` (root;
4 hosts at 1 Gbit/s, prefix ``cpsf``; SIZE bytes of the fp32 output, default 1 MiB), and
meanwhile, from another shell, ``perf record -a -g -o OUT -- sleep 5``. Prints the calls per
second (every call starts from a barrier, as in ``floors.py``).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script


def worker(rank, world_size, variant, seconds, size):
    import floors

    call = floors._calls(size, rank, world_size)[variant]
    for _ in range(20):
        call()
    calls, start, done = 0, time.perf_counter(), torch.zeros(1)
    while not done.item():
        dist.barrier()
        call()
        calls += 1
        if calls % 50 == 0:  # rank 0 decides for everyone, so that all stop together
            done[0] = time.perf_counter() - start > seconds
            dist.broadcast(done, 0)
    return calls / (time.perf_counter() - start)


def main() -> None:
    variant, seconds = sys.argv[1], float(sys.argv[2])
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 20
    with cluster_for(4, "1gbit", prefix="cpsf") as cluster:
        rate = cluster.run(worker, variant, seconds, size, timeout=600)[0]
    print(f"{variant}: {rate:.1f} calls/s")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
