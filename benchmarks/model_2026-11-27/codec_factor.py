"""Tried and not kept: a factor on codec work, fitted from rows of two codecs.

    D=benchmarks/model_2026-11-27; python $D/codec_factor.py > $D/codec_factor.txt

Codec work inside a collective may run k times slower than ``commpress codecs`` measures
(threads sharing two cores, pieces instead of one tensor). With int8 rows alone k trades
against the efficiency; with ``none`` rows too (4x the wire bytes per element) it could be
told apart. Per op and algorithm (torch's own has one codec): for each k, the codec speeds
divided by k, the model fitted on ``calib_*`` (int8) plus the sweeps' ``none`` rows; the
fit's RMS relative error on those rows, and how many held-out rows of 4 MiB and above it
predicts within 10%: the sweeps' int4 rows, their int8 rows, their ``none`` rows (in the
fit). Last, the int8-only fit (``fit.json``'s way) on the same held-out rows.
"""

from __future__ import annotations

import glob
import sys
import warnings

import numpy as np

sys.path.insert(0, "benchmarks/sim_2026-11-25")
import validate  # noqa: E402

from commpress.sim import calibrate  # noqa: E402

HERE = "benchmarks/model_2026-11-27"
FACTORS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def within(rows, fields) -> int:
    return sum(abs(t / r.time_s - 1) <= 0.10 for r, t in validate.predict(rows, fields))


def main() -> None:
    warnings.simplefilter("ignore")  # rows of several files of one machine
    speeds = calibrate.codec_speeds(f"{HERE}/codecs.json")
    calibration = calibrate.read_bench(sorted(glob.glob(f"{HERE}/calib_*.json")))
    sweeps = calibrate.read_bench(sorted(glob.glob(f"{HERE}/sweep_*.json")))
    print("| op/algorithm | fit | k with the least fit error | int4 held out | int8 held out "
          "| none |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|")
    totals = {"k": 0, "int8 only": 0}
    for op, algorithm in sorted({(r.op, r.algorithm) for r in calibration} - {
        ("all_gather", "native"), ("reduce_scatter", "native")}):  # fmt: skip
        mine = [r for r in calibration if (r.op, r.algorithm) == (op, algorithm)]
        swept = [r for r in sweeps if (r.op, r.algorithm) == (op, algorithm)]
        none = [r for r in swept if r.codec == "none"]
        held = {c: [r for r in swept if r.codec == c and r.size_bytes >= 4 << 20]
                for c in ("int4", "int8", "none")}  # fmt: skip
        best = None
        for k in FACTORS:
            slowed = {c: (e / k, d / k) for c, (e, d) in speeds.items()}
            fields = calibrate.fit_rows(mine + none, slowed)
            errors = [t / r.time_s - 1 for r, t in validate.predict(mine + none, fields)]
            rms = float(np.sqrt(np.mean(np.square(errors))))
            if best is None or rms < best[0]:
                best = (rms, k, fields)
        rms, k, fields = best
        counts = [within(held[c], fields) for c in held]
        print(f"| {op}/{algorithm} | int8 + none | {k} (RMS {rms:.3f}) | {counts[0]}/9 "
              f"| {counts[1]}/9 | {counts[2]}/9 |")  # fmt: skip
        plain = calibrate.fit_rows(mine, speeds)
        counts_plain = [within(held[c], plain) for c in held]
        print(f"| {op}/{algorithm} | int8 only | 1 | {counts_plain[0]}/9 | {counts_plain[1]}/9 "
              f"| {counts_plain[2]}/9 |")  # fmt: skip
        totals["k"] += counts[0]
        totals["int8 only"] += counts_plain[0]
    print(f"\nint4 rows of 4 MiB and above within 10%, held out: with k {totals['k']}, "
          f"int8 only {totals['int8 only']}")  # fmt: skip


if __name__ == "__main__":
    main()
