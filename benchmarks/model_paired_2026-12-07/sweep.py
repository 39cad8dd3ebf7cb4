"""Every algorithm and codec of one operation, interleaved call by call, for the cost model.

`commpress bench` times each row's calls back to back, one row after another: on our shared
2-core VMs the same row measured by two invocations minutes apart differs by more than 10%
in about a fifth of the rows from 4 MiB (`benchmarks/model_2026-11-27/README.md`), which is
as large as the model's own error. Here every variant of one size runs in the same rounds,
their order rotated round by round, each call timed from a barrier as the slowest rank's;
a row's time is the median over the rounds.

    python benchmarks/model_paired_2026-12-07/sweep.py --hosts 4 --link 1gbit \
        --sizes 1M,4M,16M,64M --codecs none,int8,int4 --rounds 8 --json PATH

Variants per operation: torch's own collective of the fp32 tensor (``native``) and each
``CODEC@ALGORITHM`` of the library (all-gather: ring, ring-hop, backend, multicast;
reduce-scatter: ring, ring-hop, alltoall). The JSON's rows are `commpress bench` rows (op,
algorithm, codec, size_bytes, time_us, nprocs, link, racks, uplink, type) plus every
round's seconds, so that `commpress sim --calibrate` and the validation read them as they
read bench rows. Run as root (it makes an emulated cluster), nothing else running.
"""

from __future__ import annotations

import statistics
import sys
from functools import partial

import torch
import torch.distributed as dist

from commpress.bench.collectives import output_for, run_collective
from commpress.bench.paired import interleaved_calls, paired_arguments
from commpress.bench.report import write_json
from commpress.cluster.commands import cluster_from, multicast_options
from commpress.cluster.jobs import main_of_script
from commpress.cluster.link import format_rate
from commpress.schedules import input_numel
from commpress.transport import multicast

ALGORITHMS = {
    "all_gather": ("ring", "ring-hop", "backend", "multicast"),
    "reduce_scatter": ("ring", "ring-hop", "alltoall"),
}
WARMUP = 2


def _calls(op: str, size: int, codecs, rank: int, world_size: int) -> dict:
    """Each variant's call on one input of ``size`` bytes as `commpress bench` counts it."""
    numel = input_numel(op, size, world_size, torch.float32)
    inp = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    out = output_for(op, inp, world_size)
    torch_own = dist.all_gather_single if op == "all_gather" else dist.reduce_scatter_single
    calls = {"native@none": lambda: torch_own(out, inp)}
    for codec in codecs:
        for algorithm in ALGORITHMS[op]:
            calls[f"{algorithm}@{codec}"] = partial(run_collective, op, algorithm, codec, inp, out)
    return calls


def _worker(rank, world_size, ops, sizes, codecs, rounds, options):
    multicast.configure(None, multicast.Options(**options))
    measured = []
    for op in ops:
        for size in sizes:
            calls = _calls(op, size, codecs, rank, world_size)
            seconds = interleaved_calls(calls, rounds, WARMUP)
            measured.append((op, size, seconds))
    return measured if rank == 0 else None


def main() -> int:
    defaults = dict(prefix="cpms", sizes="1M,4M,16M,64M", codecs="none,int8,int4", rounds=8)
    parser = paired_arguments(__doc__.splitlines()[0], **defaults)
    parser.add_argument("--ops", default="all_gather,reduce_scatter")
    args = parser.parse_args()
    ops = args.ops.split(",")
    with cluster_from(args) as cluster:
        options = multicast_options(cluster)
        measured = cluster.run(
            _worker, ops, args.sizes, args.codecs, args.rounds, options, timeout=3600
        )[0]
        where, hosts, racks = cluster.describe(), cluster.hosts, cluster.racks
        link = format_rate(cluster.link.rate_bits)
        uplink = format_rate(cluster.uplink.rate_bits) if cluster.uplink else None
    rows = []
    print(f"# {where}: medians of {args.rounds} interleaved rounds, ms (slowest rank)\n")
    print("| op | size | variant | median | min | max |")
    print("|---|---:|---|---:|---:|---:|")
    for op, size, seconds in measured:
        for variant, times in seconds.items():
            algorithm, codec = variant.split("@")
            median = statistics.median(times)
            rows.append({
                "op": op, "algorithm": algorithm, "codec": codec, "size_bytes": size,
                "type": "float", "time_us": median * 1e6, "nprocs": hosts, "link": link,
                "racks": racks, "uplink": uplink, "seconds": times,
            })  # fmt: skip
            print(f"| {op} | {size >> 20} MiB | {codec}@{algorithm} | {median * 1e3:.1f} | "
                  f"{min(times) * 1e3:.1f} | {max(times) * 1e3:.1f} |")  # fmt: skip
    if args.json:
        write_json(args.json, rows, where=where)
    return 0


if __name__ == "__main__":  # run from the module, so that the ranks can import _worker
    sys.exit(main_of_script(__file__))
