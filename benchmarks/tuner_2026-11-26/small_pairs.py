"""Reduce-scatter by the ring and by the all-to-all, paired in one cluster: rounds rotate
between the variants on the same processes and buffers; each round's time is the slowest
rank's. At 1 MiB single `commpress bench` rows of one pair differ by up to 1.9x within an
invocation, too much to tell whether the tuner's choice (the ring) was the slower one.

    python benchmarks/tuner_2026-11-26/small_pairs.py --hosts 8 --racks 2 --link 1gbit \
        --uplink 500mbit --sizes 1M,4M --codecs int8,int4 --rounds 30 --json PATH

Prints per size and codec each variant's median (ms) and the median paired difference
ring - alltoall with its 10th-90th percentile, and what the tuner (``--tune-fit``) chose.
Run as root (it makes an emulated cluster), nothing else running.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

import commpress as cp
from commpress.bench.paired import difference_deciles, interleaved_rounds, paired_arguments
from commpress.bench.report import write_json
from commpress.cluster.commands import cluster_from
from commpress.cluster.jobs import main_of_script
from commpress.cluster.link import format_rate
from commpress.sim import tuner

VARIANTS = ("ring", "alltoall")


def _paired(out, inp, codec: str, rounds: int) -> dict[str, list[float]]:
    """Each variant's ms per round."""
    current = []

    def switch(variant: str):
        current[:] = [variant]
        return lambda: None

    def call() -> None:
        cp.reduce_scatter_tensor(out, inp, codec=codec, algorithm=current[0])

    for variant in VARIANTS:  # warm-up
        switch(variant)
        call()
    seconds = interleaved_rounds(call, VARIANTS, rounds, switch)
    return {v: [s * 1e3 for s in seconds[v]] for v in VARIANTS}


def _worker(rank, world_size, sizes, codecs, rounds, tune):
    tuner.configure(**tune)
    rows = []
    for size in sizes:
        numel = size // 4
        inp = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        out = torch.empty(numel // world_size)
        for codec in codecs:
            ms = _paired(out, inp, codec, rounds)
            chosen = tuner.choose("reduce_scatter", numel, torch.float32, world_size, codec)
            row = {"size_bytes": size, "codec": codec, "chosen": str(chosen)}
            for variant in VARIANTS:
                row[variant] = statistics.median(ms[variant])
                row[f"{variant}: every round"] = ms[variant]
            row["ring - alltoall"] = difference_deciles(ms["ring"], ms["alltoall"])
            rows.append(row)
    return rows if rank == 0 else None


def main() -> int:
    defaults = dict(prefix="mcf", sizes="1M,4M", codecs="int8,int4", rounds=30)
    parser = paired_arguments(__doc__.splitlines()[0], **defaults)
    parser.add_argument("--tune-fit", default="benchmarks/tuner_2026-11-26/fit_levels.json")
    args = parser.parse_args()
    sizes = args.sizes
    with cluster_from(args) as cluster:
        topology = "switch"
        if cluster.racks > 1:
            uplink = format_rate(cluster.uplink.rate_bits)
            topology = f"racks:count={cluster.racks},uplink={uplink}"
        tune = {"topology": topology, "link": format_rate(cluster.link.rate_bits),
                "fit": args.tune_fit, "shared_cores": os.cpu_count()}  # fmt: skip
        rows = cluster.run(_worker, sizes, args.codecs, args.rounds, tune, timeout=1800)[0]
        where = cluster.describe()
    print(f"# reduce-scatter, {where}: medians of {args.rounds} rounds, ms (slowest rank)")
    print("| size | codec | ring | alltoall | ring - alltoall (10th .. 90th) | tuner chose |")
    print("|---:|---|---:|---:|---|---|")
    for row in rows:
        median, low, high = row["ring - alltoall"]
        print(
            f"| {row['size_bytes'] >> 20} MiB | {row['codec']} | {row['ring']:.1f} | "
            f"{row['alltoall']:.1f} | {median:+.1f} ({low:+.1f} .. {high:+.1f}) | "
            f"{row['chosen']} |"
        )
    if args.json:
        write_json(args.json, rows, where=where)
    return 0


if __name__ == "__main__":  # run from the module, so that the ranks can import _worker
    sys.exit(main_of_script(__file__))
