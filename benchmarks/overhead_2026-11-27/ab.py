"""The library at an earlier commit against the working tree, call by call in the same
processes: the per-call cost of a small compressed all-gather or reduce-scatter.

``python benchmarks/overhead_2026-11-27/ab.py --before COMMIT --hosts 4 --rounds 100
--sizes 1M,4M`` (root; hosts at 1 Gbit/s, prefix ``cpab``). The package at ``COMMIT`` is
extracted and renamed ``commpress_before`` (every import and dotted name of it), so
that both versions load side by side; the variants of a round run back to back in a
rotated order (:func:`commpress.bench.paired.interleaved_rounds`). Per variant: the median
time of the slowest rank, and the median CPU seconds per call of a rank's process (every
thread: the caller's, the communication thread, gloo's), summed over the ranks; then the
paired difference after - before with its 95% interval.
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from commpress.bench.arguments import byte_size
from commpress.bench.paired import interleaved_rounds, paired_difference
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script

WARMUP = 3
#: The package's name where it names the package (``commpress.x``, ``import commpress``,
#: ``from commpress``), not in strings such as the stochastic-rounding seed's text
IMPORTS = re.compile(r"(?<![\w-])commpress(?=\.)|(?<=import )commpress\b|(?<=from )commpress\b")
REPOSITORY = Path(__file__).resolve().parents[2]


def extract(commit: str, into: Path) -> None:
    """``src/commpress`` at ``commit`` as the package ``commpress_before`` under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPOSITORY), "archive", commit, "src/commpress"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    package = into / "src" / "commpress"
    for source in package.rglob("*.py"):
        source.write_text(IMPORTS.sub("commpress_before", source.read_text()))
    package.rename(into / "commpress_before")


def _calls(size: int, op: str, spec: str, rank: int, world_size: int) -> dict:
    versions = {"before": importlib.import_module("commpress_before"),
                "after": importlib.import_module("commpress")}  # fmt: skip
    codec, algorithm = spec.split("@")
    if op == "all_gather":
        inp = torch.randn(size // 4 // world_size)
        out = torch.empty(inp.numel() * world_size)
        native = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
        name = "all_gather_into_tensor"
    else:
        inp = torch.randn(size // 4)
        out = torch.empty(inp.numel() // world_size)
        native = lambda: dist.reduce_scatter_tensor(out, inp)  # noqa: E731
        name = "reduce_scatter_tensor"
    calls = {"native": native}
    for version, package in versions.items():
        function = getattr(package, name)
        calls[version] = lambda f=function: f(out, inp, codec=codec, algorithm=algorithm)
    return calls


def _timed(calls: dict, rounds: int) -> tuple[dict, dict]:
    """Each variant's seconds per call (slowest rank) and this process's CPU seconds."""
    cpu = {variant: [] for variant in calls}
    current = {}

    def switch(variant):
        current["variant"] = variant
        return lambda: None

    def call():
        variant = current["variant"]
        start = time.process_time()
        calls[variant]()
        cpu[variant].append(time.process_time() - start)

    times = interleaved_rounds(call, list(calls), rounds, switch, WARMUP)
    return times, {variant: spent[WARMUP:] for variant, spent in cpu.items()}


def worker(rank, world_size, sizes, ops, specs, rounds):
    return {
        (size, op, spec): _timed(_calls(size, op, spec, rank, world_size), rounds)
        for size in sizes
        for op in ops
        for spec in specs
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit to compare against")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--sizes", default="1M,4M")
    parser.add_argument("--ops", default="all_gather")
    parser.add_argument("--specs", default="int8@ring,int8@backend")
    args = parser.parse_args()
    sizes = [byte_size(s) for s in args.sizes.split(",")]
    ops, specs = args.ops.split(","), args.specs.split(",")
    with tempfile.TemporaryDirectory(prefix="commpress-before-") as scratch:
        extract(args.before, Path(scratch))
        sys.path.insert(0, scratch)  # the ranks inherit sys.path
        with cluster_for(args.hosts, "1gbit", prefix="cpab") as cluster:
            results = cluster.run(worker, sizes, ops, specs, args.rounds, timeout=3600)
    commit = subprocess.run(["git", "-C", str(REPOSITORY), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    print(f"{args.hosts} hosts at 1 Gbit/s, {args.rounds} rounds; before = {args.before}, "
          f"after = the working tree on {commit}")  # fmt: skip
    print("| size | op | spec | variant | time (ms) | CPU per call, all ranks (ms) |"
          " after - before: time (95% interval) | CPU |")  # fmt: skip
    print("|---:|---|---|---|---:|---:|---:|---:|")
    for (size, op, spec), (times, _) in results[0].items():
        cpu = {
            variant: [sum(r[size, op, spec][1][variant][i] for r in results)
                      for i in range(args.rounds)]
            for variant in times
        }  # fmt: skip
        for variant in times:
            line = (f"| {size >> 20} MiB | {op} | {spec} | {variant} | "
                    f"{1e3 * statistics.median(times[variant]):.2f} | "
                    f"{1e3 * statistics.median(cpu[variant]):.2f} |")  # fmt: skip
            if variant == "after":
                difference = paired_difference(times["after"], times["before"])
                mid, low, high = (1e3 * t for t in difference)
                cpu_mid = 1e3 * paired_difference(cpu["after"], cpu["before"])[0]
                line += f" {mid:+.2f} ({low:+.2f} to {high:+.2f}) | {cpu_mid:+.2f} |"
            else:
                line += " | |"
            print(line)


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
