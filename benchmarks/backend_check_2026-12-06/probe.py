"""Where ``backend``'s fixed cost goes at small sizes: the library's int8 ``backend``
all-gather against its parts, interleaved call by call.

``python benchmarks/backend_check_2026-12-06/probe.py HOSTS ROUNDS SIZE...`` (root;
HOSTS hosts at 1 Gbit/s, prefix ``cpbc``). SIZE: bytes of the fp32 all-gather output.
Variants, each timed as the slowest rank's seconds per call:

* ``native``: gloo's all-gather of the fp32 tensor;
* ``native-bytes``: gloo's all-gather of as many uint8 as one int8 payload;
* ``backend``: ``cp.all_gather_into_tensor(..., codec="int8", algorithm="backend")``;
* ``backend-bare``: its executor on the calling thread without the argument check;
* ``backend-checked``: its executor on the calling thread with the argument check (what
  the public call adds to it is the hand-over to the communication thread);
* ``verdict-allreduce``: the check's verdict alone: an all-reduce (MAX) of two int64;
* ``digest-allgather``: one int64 per rank all-gathered (a verdict in n-1 hops);
* ``header-p2p``: the check's header alone: 32 bytes to the right, from the left.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist

import commpress as cp
from commpress.bench.paired import interleaved_calls, paired_difference
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.codecs import get_codec
from commpress.collectives.all_gather import gather
from commpress.collectives.fingerprint import Fingerprint

VARIANTS = (
    "native",
    "native-bytes",
    "backend",
    "backend-bare",
    "backend-checked",
    "verdict-allreduce",
    "digest-allgather",
    "header-p2p",
)
WARMUP = 3
#: The paired differences printed: what the argument check adds to the bare executor, and
#: what the public call adds to the checked executor (the hand-over, the call's checks).
PAIRS = (("backend-checked", "backend-bare"), ("backend", "backend-checked"))


def _calls(size: int, rank: int, world_size: int) -> dict:
    codec = get_codec("int8")
    shard = size // 4 // world_size
    inp, out = torch.randn(shard), torch.empty(shard * world_size)
    payload = codec.wire_bytes(shard, torch.float32)
    raw_in = torch.zeros(payload, dtype=torch.uint8)
    raw_out = torch.empty(payload * world_size, dtype=torch.uint8)
    group = dist.group.WORLD
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    pair = torch.tensor([7, -7], dtype=torch.int64)
    digest = torch.tensor([7], dtype=torch.int64)
    digests = torch.empty(world_size, dtype=torch.int64)
    fingerprint = Fingerprint.of("all_gather", inp, codec, "backend")
    header, scratch = torch.zeros(32, dtype=torch.uint8), torch.empty(32, dtype=torch.uint8)

    def header_p2p():
        works = [group.send([header], right, 0), group.recv([scratch], left, 0)]
        for work in works:
            work.wait()

    return {
        "native": lambda: dist.all_gather_into_tensor(out, inp),
        "native-bytes": lambda: dist.all_gather_into_tensor(raw_out, raw_in),
        "backend": lambda: cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="backend"),
        # the output is the caller's, as in the public call (its decodes stream since 926efd3)
        "backend-bare": lambda: gather(out, inp, group, codec, "backend", None, None, True),
        "backend-checked": lambda: gather(
            out, inp, group, codec, "backend", None, fingerprint, stream_output=True
        ),
        "verdict-allreduce": lambda: dist.all_reduce(pair, dist.ReduceOp.MAX),
        "digest-allgather": lambda: dist.all_gather_into_tensor(digests, digest),
        "header-p2p": header_p2p,
    }


def worker(rank, world_size, sizes, rounds):
    return {
        size: interleaved_calls(_calls(size, rank, world_size), rounds, WARMUP) for size in sizes
    }


def main() -> None:
    hosts, rounds = int(sys.argv[1]), int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    with cluster_for(hosts, "1gbit", prefix="cpbc") as cluster:
        results = cluster.run(worker, sizes, rounds, timeout=3600)[0]
    print(f"{hosts} hosts at 1 Gbit/s, {rounds} rounds, medians of the slowest rank (ms)")
    print("| size (B) | variant | median | p25 | p75 |")
    print("|---:|---|---:|---:|---:|")
    for size, times in results.items():
        for variant in VARIANTS:
            q = statistics.quantiles([t * 1e3 for t in times[variant]], n=4)
            print(f"| {size} | {variant} | {q[1]:.2f} | {q[0]:.2f} | {q[2]:.2f} |")
    print("\n| size (B) | paired difference | median (95% interval) |")
    print("|---:|---|---:|")
    for size, times in results.items():
        for a, b in PAIRS:
            middle, low, high = (1e3 * t for t in paired_difference(times[a], times[b]))
            print(f"| {size} | {a} - {b} | {middle:+.2f} ({low:+.2f} to {high:+.2f}) |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
