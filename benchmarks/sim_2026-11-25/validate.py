"""The cost model against every time we measured on the emulated cluster.

    python benchmarks/sim_2026-11-25/validate.py > benchmarks/sim_2026-11-25/validation.md

Per machine (the VM a file's provenance names: they differ from session to session), fits
the model (``commpress.sim.calibrate``) on every row (in sample), and on the rows of fewer
than 8 hosts only, to predict the 8-host rows it has not seen (held out). Prints, per row,
measured and predicted time and the error, then the share of rows within 10% by algorithm
at 4 MiB and above. Codec speeds: ``benchmarks/codecs_cpu-2core_2026-11-22.json``.
"""

from __future__ import annotations

import collections
import dataclasses
import glob

from commpress.sim import calibrate
from commpress.sim.model import Params, simulate

CODECS = "benchmarks/codecs_cpu-2core_2026-11-22.json"
FILES = sorted(
    glob.glob("benchmarks/*_emulated-*x1gbit_2026-11-2*.json")
    + glob.glob("benchmarks/multicast_2026-11-25/racks_*.json")
    + glob.glob("benchmarks/multicast_2026-11-25/switch*.json")
    + glob.glob("benchmarks/sim_2026-11-25/bench_*.json")
    + glob.glob("benchmarks/sim_2026-11-25/auto_*.json")
)


def predict(rows, fields) -> list[tuple]:
    params = Params(**fields)
    out = []
    for row in rows:
        mine = dataclasses.replace(
            params, concurrent_roots=row.roots, shared_cores=row.shared_cores
        )
        call = simulate(row.op, row.algorithm, row.codec, row.size_bytes, row.topology, mine)
        out.append((row, call.time_us * 1e-6))
    return out


def table(predictions, title: str) -> None:
    print(f"\n## {title}\n")
    print("| file | hosts | topology | op | algorithm | codec | MiB | measured ms | predicted ms "
          "| error |")  # fmt: skip
    print("|---|---:|---|---|---|---|---:|---:|---:|---:|")
    within = collections.defaultdict(lambda: [0, 0])
    for row, predicted in predictions:
        error = predicted / row.time_s - 1
        name = row.source.removeprefix("benchmarks/")
        print(
            f"| {name} | {row.topology.nodes} | {row.topology} | {row.op} | {row.algorithm} "
            f"| {row.codec} | {row.size_bytes >> 20} | {row.time_s * 1e3:.1f} "
            f"| {predicted * 1e3:.1f} | {error:+.0%} |"
        )
        if row.size_bytes >= 4 << 20:
            counts = within[(row.op, row.algorithm)]
            counts[0] += abs(error) <= 0.10
            counts[1] += 1
    print(f"\nRows of 4 MiB and above within 10% ({title}):\n")
    print("| op | algorithm | within 10% |")
    print("|---|---|---:|")
    for (op, algorithm), (good, total) in sorted(within.items()):
        print(f"| {op} | {algorithm} | {good}/{total} |")


def main() -> None:
    rows = calibrate.read_bench(FILES)
    speeds = calibrate.codec_speeds(CODECS)
    print("# The cost model against our measurements\n")
    print("Files: " + ", ".join(f"`{f}`" for f in FILES))
    print("\nEach machine (the VM a file's provenance names) is fitted on its own rows.")
    for machine in sorted({row.machine for row in rows}):
        mine = [row for row in rows if row.machine == machine]
        fields = calibrate.fit_rows(mine, speeds)
        print(f"\n# {machine}\n\nFit on its {len(mine)} rows: {calibrate.describe(fields)}")
        table(predict(mine, fields), f"{machine}, in sample")
        smaller = [r for r in mine if r.topology.nodes < 8]
        eight = [r for r in mine if r.topology.nodes == 8]
        if not smaller or not eight:
            continue
        held = calibrate.fit_rows(smaller, speeds)
        print(f"\nFit on its rows of fewer than 8 hosts: {calibrate.describe(held)}")
        table(predict(eight, held), f"{machine}, held out: fitted below 8 hosts, predicting 8")


if __name__ == "__main__":
    main()
