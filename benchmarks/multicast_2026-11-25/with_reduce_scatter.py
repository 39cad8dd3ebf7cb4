"""An all-gather while a ring reduce-scatter of the same size runs (FSDP's situation: the next
layer's parameters gathered while the last layer's gradients are reduced).

Each rank runs the reduce-scatter (int8, ring) on a thread of its own over a process group
of its own, and the all-gather (ring or multicast) on the main thread, started together;
then each alone, for reference. commpress's public calls queue every compressed collective
on one communication thread (so that ranks issue them in the same order), which would run
the two one after the other: this script calls the collectives' bodies directly to run
them at once. Times are medians over ITERATIONS of the slowest rank.

    python benchmarks/multicast_2026-11-25/with_reduce_scatter.py --hosts 8 --racks 2 --link 1gbit \
        --uplink 500mbit --mtu 9000 --size 16M --json PATH
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

from commpress.bench.arguments import byte_size
from commpress.bench.report import write_json
from commpress.cluster.commands import add_link_arguments, cluster_from, multicast_options
from commpress.cluster.jobs import main_of_script
from commpress.codecs import get_codec
from commpress.collectives.all_gather import gather
from commpress.collectives.reduce_scatter import reduce
from commpress.schedules import DEFAULT_CHUNK_BYTES
from commpress.transport import multicast

ITERATIONS = 5
GATHERS = (("ring", "none"), ("multicast", "none"), ("ring", "int8"), ("multicast", "int8"))


def _slowest(seconds: float) -> float:
    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


def _worker(rank, world_size, size_bytes, options):
    scatter_group = dist.new_group()
    multicast.configure(None, multicast.Options(**options))
    shard = size_bytes // 4 // world_size
    inp = torch.randn(shard, generator=torch.Generator().manual_seed(rank))
    out = torch.empty(shard * world_size)
    gradients = torch.randn(shard * world_size, generator=torch.Generator().manual_seed(9 + rank))
    int8 = get_codec("int8")

    def scatter():
        reduce(gradients, scatter_group, int8, "ring", DEFAULT_CHUNK_BYTES, None, None)

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    rows = []
    for algorithm, codec_name in GATHERS:
        codec = get_codec(codec_name)

        def gather_once(algorithm=algorithm, codec=codec):
            gather(out, inp, None, codec, algorithm, None)

        gather_once()  # warm-up: sets up the channel, compiles the codec
        scatter()
        alone, together, scatter_alone, scatter_together, both = [], [], [], [], []
        for _ in range(ITERATIONS):
            dist.barrier()
            alone.append(_slowest(timed(gather_once)))
            dist.barrier()
            scatter_alone.append(_slowest(timed(scatter)))
            dist.barrier()
            took = {}
            thread = threading.Thread(target=lambda took=took: took.update(rs=timed(scatter)))
            start = time.perf_counter()
            thread.start()
            took["ag"] = timed(gather_once)
            thread.join()
            both.append(_slowest(time.perf_counter() - start))
            together.append(_slowest(took["ag"]))
            scatter_together.append(_slowest(took["rs"]))
        rows.append(
            {
                "algorithm": algorithm,
                "codec": codec_name,
                "size_bytes": size_bytes,
                "all_gather_alone_ms": statistics.median(alone) * 1e3,
                "all_gather_with_rs_ms": statistics.median(together) * 1e3,
                "reduce_scatter_alone_ms": statistics.median(scatter_alone) * 1e3,
                "reduce_scatter_with_ag_ms": statistics.median(scatter_together) * 1e3,
                "both_ms": statistics.median(both) * 1e3,
            }
        )
    return rows if rank == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_link_arguments(parser, required=False)
    parser.set_defaults(hosts=8, link="1gbit", mtu=9000, prefix="mcc")
    parser.add_argument("--size", type=byte_size, default=16 << 20)
    parser.add_argument("--json")
    args = parser.parse_args()
    with cluster_from(args) as cluster:
        rows = cluster.run(_worker, args.size, multicast_options(cluster), timeout=1800)[0]
        where = cluster.describe()
    print(f"# all-gather with a concurrent ring int8 reduce-scatter, {where}, {args.size} B")
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()))
    if args.json:
        write_json(args.json, rows, where=where)
    return 0


if __name__ == "__main__":  # run from the module, so that the ranks can import _worker
    sys.exit(main_of_script(__file__))
