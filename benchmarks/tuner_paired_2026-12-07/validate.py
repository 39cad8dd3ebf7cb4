"""The cost model of this folder's fit against the calibration rows (in sample) and against
the paired runs' medians (held out: other invocations, each variant interleaved with the
others over 20 or 12 rounds); then how far the measurements themselves move between
invocations (calibration row against paired median, and paired run 1 against run 2).

    python benchmarks/tuner_paired_2026-12-07/validate.py \
        > benchmarks/tuner_paired_2026-12-07/validation.md

(``validate.py DIR > DIR/validation.md`` reads another run's folder, as ``measure.sh DIR``
makes it.)
"""

from __future__ import annotations

import dataclasses
import glob
import json
import statistics
import sys

sys.path.insert(0, "benchmarks/sim_2026-11-25")
import validate  # noqa: E402

from commpress.sim import calibrate  # noqa: E402

HERE = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/tuner_paired_2026-12-07"
CODEC = "int8"


def paired_rows(path: str, like: dict, fitted: set) -> list[calibrate.Measured]:
    """Each explicit variant's median of a paired run, as a calibration row of the same
    cluster would be (``like``: a calibration row of that cluster, per op), but variants
    the fit has no terms for (``fitted``: its "op/algorithm" keys; a later ``paired.py``
    times the reduce-scatter's ``backend`` too, which the calibration leaves out)."""
    rows = []
    with open(path) as file:
        measured = json.load(file)["rows"]
    for row in measured:
        for variant, seconds in row["seconds"].items():
            if variant == "auto" or f"{row['op']}/{variant}" not in fitted:
                continue
            codec = "none" if variant == "native" else CODEC
            rows.append(dataclasses.replace(
                like[row["op"]], algorithm=variant, codec=codec, size_bytes=row["size_bytes"],
                time_s=statistics.median(seconds), source=path,
            ))  # fmt: skip
    return rows


def key(row: calibrate.Measured) -> tuple:
    return (row.topology.nodes, row.op, row.algorithm, row.size_bytes)


def agreement(first, second, title: str) -> None:
    """How often two measurements of the same row are within 10% of each other."""
    seconds = {key(row): row.time_s for row in second}
    within = total = 0
    worst = 0.0
    for row in first:
        if row.size_bytes < 4 << 20 or key(row) not in seconds:
            continue
        ratio = seconds[key(row)] / row.time_s
        within += abs(ratio - 1) <= 0.10
        total += 1
        worst = max(worst, abs(ratio - 1))
    print(f"- {title}: {within}/{total} rows of 4 MiB and above within 10% "
          f"(largest difference {worst:.0%})")  # fmt: skip


def main() -> None:
    fields = calibrate.load(f"{HERE}/fit.json")
    calibration = calibrate.read_bench(sorted(glob.glob(f"{HERE}/calib_*.json")))
    print("# The cost model of `fit.json` against this folder's measurements\n")
    print(f"Fit: {calibrate.describe(fields)}")
    validate.table(validate.predict(calibration, fields), "in sample: the calibration rows")
    runs = {}
    for cluster in ("4hosts", "8racks"):
        like = {row.op: row for row in calibration if f"calib_{cluster}_" in row.source}
        for run in (1, 2):
            path = f"{HERE}/paired_{cluster}_run{run}.json"
            runs[cluster, run] = paired_rows(path, like, set(fields["message_s"]))
    held = [row for rows in runs.values() for row in rows]
    validate.table(validate.predict(held, fields), "held out: the paired runs' medians")
    print("\n## The measurements against each other\n")
    for cluster in ("4hosts", "8racks"):
        mine = [row for row in calibration if f"calib_{cluster}_" in row.source]
        for run in (1, 2):
            agreement(mine, runs[cluster, run], f"{cluster}: calibration row / paired run {run}")
        agreement(runs[cluster, 1], runs[cluster, 2], f"{cluster}: paired run 1 / run 2")


if __name__ == "__main__":
    main()
