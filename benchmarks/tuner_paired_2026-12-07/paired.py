"""The tuner's choice against every algorithm it chooses among, interleaved call by call.

Issue 14 asks that the autotuner's choice be never more than 10% slower than the best
algorithm measured on the same sweep. Rows of `commpress bench` (each variant's calls back
to back, one row after the other) differ between invocations by more than that on our
shared 2-core VMs, so single rows cannot tell a wrong choice from a disturbed row. Here
every variant of one size runs in the same rounds, their order rotated round by round,
each call timed from a barrier as the slowest rank's; the verdict is the median over the
rounds of the per-round ratio chosen / fastest, with a 95% bootstrap interval.

    python benchmarks/tuner_paired_2026-12-07/paired.py --hosts 4 --link 1gbit \
        --sizes 1M,4M,16M,64M --rounds 20 --tune-fit FIT.json --json PATH

Variants, per operation, with codec int8 (the request `algorithm="auto", codec="int8"`):
torch's own collective of the fp32 tensor (``native``), each compressed algorithm the
tuner considers for it (its defaults: ring, backend, alltoall; ``--candidates`` gives
others, ring-hop and multicast, which the tuner is then configured to consider too), and
``auto`` itself (the public call, which runs the tuner's choice). 3 warm-up rounds are not
kept. Run as root (it makes an emulated cluster), nothing else running.
"""

from __future__ import annotations

import statistics
import sys
from functools import partial

import torch
import torch.distributed as dist

from commpress.bench.collectives import output_for, run_collective
from commpress.bench.paired import interleaved_calls, paired_arguments, paired_ratio
from commpress.bench.report import write_json
from commpress.cluster.commands import cluster_from, multicast_options, tuner_network
from commpress.cluster.jobs import main_of_script
from commpress.collectives.auto import recording
from commpress.schedules import algorithms, input_numel
from commpress.sim import tuner
from commpress.transport import multicast

CODEC = "int8"
OPS = ("all_gather", "reduce_scatter")
DEFAULT_CANDIDATES = ("ring", "backend", "alltoall")  # the tuner's own, but native


def candidates_of(op: str, candidates) -> tuple[str, ...]:
    return tuple(name for name in candidates if name in algorithms(op))


def _calls(op: str, inp, out, candidates, ran: set) -> dict:
    """Each variant's call; what the ``auto`` calls ran is added to ``ran``."""
    torch_own = dist.all_gather_single if op == "all_gather" else dist.reduce_scatter_single

    def tuned() -> None:
        with recording() as record:
            run_collective(op, "auto", CODEC, inp, out)
        ran.update(f"{codec}@{algorithm}" for algorithm, codec in record)

    calls = {"native": lambda: torch_own(out, inp)}
    for algorithm in candidates_of(op, candidates):
        calls[algorithm] = partial(run_collective, op, algorithm, CODEC, inp, out)
    calls["auto"] = tuned
    return calls


def _worker(rank, world_size, sizes, rounds, tune, candidates, options):
    tuner.configure(**tune, algorithms=("native", *candidates))
    multicast.configure(None, multicast.Options(**options))
    rows = []
    for op in OPS:
        for size in sizes:
            numel = input_numel(op, size, world_size, torch.float32)
            inp = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
            out = output_for(op, inp, world_size)
            chosen = tuner.choose(op, numel, torch.float32, world_size, CODEC,
                                  multicast=multicast.options_of(None))  # fmt: skip
            ran = set()
            calls = _calls(op, inp, out, candidates, ran)
            seconds = interleaved_calls(calls, rounds)
            rows.append({"op": op, "size_bytes": size, "chosen": str(chosen),
                         "chosen_algorithm": chosen.algorithm, "auto_ran": sorted(ran),
                         "seconds": seconds})  # fmt: skip
    return rows if rank == 0 else None


def _table(rows, rounds: int, where: str) -> list[str]:
    lines = [
        f"# int8 requests on {where}: medians of {rounds} interleaved rounds, ms (slowest rank)",
        "",
        "| op | size | medians | fastest | tuner chose | auto ran | "
        "chosen / fastest, per round (95%) | auto / fastest (95%) |",
        "|---|---:|---|---|---|---|---:|---:|",
    ]
    for row in rows:
        seconds = row["seconds"]
        medians = {variant: statistics.median(times) * 1e3 for variant, times in seconds.items()}
        explicit = [variant for variant in medians if variant != "auto"]
        fastest = min(explicit, key=medians.get)
        ratio = paired_ratio(seconds[row["chosen_algorithm"]], seconds[fastest])
        auto = paired_ratio(seconds["auto"], seconds[fastest])
        shown = ", ".join(f"{variant} {ms:.1f}" for variant, ms in medians.items())
        lines.append(
            f"| {row['op']} | {row['size_bytes'] >> 20} MiB | {shown} | {fastest} | "
            f"{row['chosen']} | {', '.join(row['auto_ran'])} | "
            f"{ratio[0]:.3f} ({ratio[1]:.3f}-{ratio[2]:.3f}) | "
            f"{auto[0]:.3f} ({auto[1]:.3f}-{auto[2]:.3f}) |"
        )
    return lines


def main() -> int:
    defaults = dict(prefix="cptp", sizes="1M,4M,16M,64M", codecs=CODEC, rounds=20)
    parser = paired_arguments(__doc__.splitlines()[0], **defaults)
    parser.add_argument("--tune-fit", required=True)
    parser.add_argument("--candidates", default=",".join(DEFAULT_CANDIDATES))
    args = parser.parse_args()
    candidates = tuple(args.candidates.split(","))
    with cluster_from(args) as cluster:
        tune = tuner_network(cluster, args.tune_fit)
        options = multicast_options(cluster)
        rows = cluster.run(
            _worker, args.sizes, args.rounds, tune, candidates, options, timeout=3600
        )[0]
        where = cluster.describe()
    print("\n".join(_table(rows, args.rounds, where)))
    if args.json:
        write_json(args.json, rows, where=where)
    return 0


if __name__ == "__main__":  # run from the module, so that the ranks can import _worker
    sys.exit(main_of_script(__file__))
