"""A tuner folder's measurements read again with a fit made now: the fit saved in the
folder against one fitted now from the same calibration rows (this commpress's
calibration, with its time per call), each judged on the folder's paired runs (held out).

    python benchmarks/model_per_call_2026-12-07/tuner_refit.py DIR

``DIR``: a folder made by ``benchmarks/tuner_paired_2026-12-07/measure.sh``. Prints, per
fit: the rows of 4 MiB and above within 10% (calibration rows in sample, paired medians
held out), then, for every paired comparison, the algorithm the fit's model calls fastest
among the measured candidates and the median over rounds of its time / the fastest
candidate's (by median), with a 95% bootstrap interval. This reads what the tuner would
have chosen off measurements already made; the choice the runtime made is the ``recorded``
column.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import statistics
import sys
import warnings

sys.path.insert(0, "benchmarks/tuner_paired_2026-12-07")
import validate  # noqa: E402

from commpress.bench.paired import paired_ratio  # noqa: E402
from commpress.sim import calibrate  # noqa: E402
from commpress.sim.model import Params, simulate  # noqa: E402

CLUSTERS, RUNS, CODEC = ("4hosts", "8racks"), (1, 2), "int8"


def predicted_s(params: Params, like: calibrate.Measured, op, algorithm, size) -> float:
    mine = dataclasses.replace(params, concurrent_roots=like.roots, shared_cores=like.shared_cores)
    codec = "none" if algorithm == "native" else CODEC
    return simulate(op, algorithm, codec, size, like.topology, mine).time_us * 1e-6


def within(params: Params, rows) -> str:
    large = [row for row in rows if row.size_bytes >= 4 << 20]
    close = sum(
        abs(predicted_s(params, row, row.op, row.algorithm, row.size_bytes) / row.time_s - 1)
        <= 0.10
        for row in large
    )
    return f"{close}/{len(large)}"


def main() -> None:
    folder = sys.argv[1]
    calibration_files = sorted(glob.glob(f"{folder}/calib_*.json"))
    calibration = calibrate.read_bench(calibration_files)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # left out of the fit: said in the table below
        fits = {
            "saved (fit.json)": calibrate.load(f"{folder}/fit.json"),
            "fitted now": calibrate.fit(calibration_files, f"{folder}/codecs.json"),
        }
    print(f"# {folder}: its saved fit against one fitted now\n")
    for name, fields in fits.items():
        print(f"- {name}: {calibrate.describe(fields)}")
    print("\n| fit | in sample | held out | chosen within 10% of the fastest |")
    print("|---|---:|---:|---:|")
    choices = []
    for name, fields in fits.items():
        params, held, good, total = Params(**fields), [], 0, 0
        for cluster in CLUSTERS:
            like = {row.op: row for row in calibration if f"calib_{cluster}_" in row.source}
            for run in RUNS:
                path = f"{folder}/paired_{cluster}_run{run}.json"
                held += validate.paired_rows(path, like, set(fields["message_s"]))
                with open(path) as file:
                    measured = json.load(file)["rows"]
                for row in measured:
                    op, size, seconds = row["op"], row["size_bytes"], row["seconds"]
                    known = [
                        v for v in seconds if v != "auto" and f"{op}/{v}" in fields["message_s"]
                    ]
                    model = {v: predicted_s(params, like[op], op, v, size) for v in known}
                    chosen = min(model, key=model.get)
                    fastest = min(known, key=lambda v: statistics.median(seconds[v]))
                    ratio, low, high = paired_ratio(seconds[chosen], seconds[fastest])
                    good += ratio <= 1.10
                    total += 1
                    choices.append((name, cluster, run, op, size, chosen, fastest, ratio, low,
                                    high, row["chosen_algorithm"]))  # fmt: skip
        print(f"| {name} | {within(params, calibration)} | {within(params, held)} "
              f"| {good}/{total} |")  # fmt: skip
    print("\n| fit | cluster | run | op | MiB | chosen | fastest | chosen / fastest (95%) "
          "| recorded |")  # fmt: skip
    print("|---|---|---:|---|---:|---|---|---:|---|")
    for name, cluster, run, op, size, chosen, fastest, ratio, low, high, recorded in choices:
        print(f"| {name} | {cluster} | {run} | {op} | {size >> 20} | {chosen} | {fastest} "
              f"| {ratio:.3f} ({low:.3f}-{high:.3f}) | {recorded} |")  # fmt: skip


if __name__ == "__main__":
    main()
