"""Where a large int8 ``backend`` all-gather's time goes, on 4 emulated hosts at 1 Gbit/s:
gloo's all-gather of the payload bytes alone (its floor), the executor without the argument
check, and the public call; variants interleaved call by call, medians of the slowest rank.

``python benchmarks/backend_large_2026-12-06/floor.py MIB ROUNDS`` (root)."""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist

import commpress as cp
from commpress.bench.paired import interleaved_calls
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.codecs import get_codec
from commpress.collectives.all_gather import gather


def worker(rank, world_size, size, rounds):
    inp = torch.randn(size // 4 // world_size)
    out = torch.empty(inp.numel() * world_size)
    codec = get_codec("int8")
    wire = codec.wire_bytes(inp.numel(), torch.float32)
    payload = torch.zeros(wire, dtype=torch.uint8)
    gathered = torch.empty(wire * world_size, dtype=torch.uint8)
    calls = {
        "payload bytes (gloo)": lambda: dist.all_gather_into_tensor(gathered, payload),
        "executor, no check": lambda: gather(out, inp, None, codec, "backend", None, None, True),
        "int8@backend": lambda: cp.all_gather_into_tensor(out, inp, algorithm="backend"),
        "encode alone": lambda: codec.encode(inp),
    }
    return interleaved_calls(calls, rounds)


def main() -> None:
    size, rounds = int(sys.argv[1]) << 20, int(sys.argv[2])
    with cluster_for(4, "1gbit", prefix="cpfl") as cluster:
        times = cluster.run(worker, size, rounds, timeout=3600)[0]
    print(f"4 hosts at 1 Gbit/s, {size >> 20} MiB, {rounds} rounds (ms, slowest rank, medians)")
    for variant, spent in times.items():
        print(f"| {variant} | {1e3 * statistics.median(spent):.2f} |")


if __name__ == "__main__":
    sys.exit(main_of_script(__file__))
