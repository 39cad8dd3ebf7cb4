"""The cost model, recalibrated on this VM, against its calibration rows and later sweeps.

    python benchmarks/model_2026-11-27/validate.py PHASE > benchmarks/model_2026-11-27/OUT.md

PHASE ``fit``: fit on this folder's ``calib_*.json`` (int8 and torch's own, 2 and 4 hosts
on one switch, 8 hosts in 2 racks, 1-64 MiB; codec speeds from ``codecs.json``), saved as
``fit.json``; every calibration row predicted (in sample), then the rows held out by size
(fitted on 1 and 16 MiB, predicting 4 and 64 MiB). PHASE ``sweeps``: the ``sweep_*.json``
rows (codecs none, int8, int4, measured after the fit) predicted by ``fit.json``, and the
tuner's choice for their ``auto`` rows against the rows of the same invocation. Run with
``PYTHONPATH`` at another checkout to see that checkout's model on the same rows (the fit
is then written to ``fit_PHASE_other.json``).
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import sys

sys.path.insert(0, "benchmarks/sim_2026-11-25")
sys.path.insert(0, "benchmarks/tuner_2026-11-26")
import validate  # noqa: E402
import validate_levels  # noqa: E402

from commpress.sim import calibrate  # noqa: E402

HERE = "benchmarks/model_2026-11-27"
CODECS = f"{HERE}/codecs.json"
CALIBRATION = sorted(glob.glob(f"{HERE}/calib_*.json"))
SWEEPS = sorted(glob.glob(f"{HERE}/sweep_*.json"))
HERE_SOURCE = os.path.abspath("src")


def fit_path() -> str:
    """This checkout's fit, or another checkout's (``PYTHONPATH``) beside it."""
    mine = os.path.abspath(os.path.join(os.path.dirname(calibrate.__file__), "..", ".."))
    return f"{HERE}/fit.json" if mine == HERE_SOURCE else f"{HERE}/fit_other.json"


def main(phase: str) -> None:
    speeds = calibrate.codec_speeds(CODECS)
    rows = calibrate.read_bench(CALIBRATION)
    print(f"# The cost model on this VM: {phase}\n")
    print(f"commpress from `{calibrate.__file__}`\n")
    if phase == "fit":
        fields = calibrate.fit_rows(rows, speeds)
        calibrate.save(fit_path(), fields)
        print(f"Fit on {len(rows)} rows of " + ", ".join(f"`{f}`" for f in CALIBRATION))
        print(f"\n{calibrate.describe(fields)}")
        validate.table(validate.predict(rows, fields), "in sample")
        sizes = (1 << 20, 16 << 20)
        held = calibrate.fit_rows([r for r in rows if r.size_bytes in sizes], speeds)
        print(f"\n\nFit on the 1 and 16 MiB rows: {calibrate.describe(held)}")
        others = [r for r in rows if r.size_bytes not in sizes]
        validate.table(validate.predict(others, held), "held out by size: 4 and 64 MiB")
        return
    fields = calibrate.load(fit_path())
    print(f"Fit `{fit_path()}`: {calibrate.describe(fields)}")
    swept = calibrate.read_bench(SWEEPS)
    validate.table(validate.predict(swept, fields), "held out: later sweeps, none/int8/int4")
    print("\n## The tuner's choice against the rows of the same invocation\n")
    print("| file | size | codec asked | chosen | fastest allowed | chosen / best |")
    print("|---|---:|---|---|---|---:|")
    validate_levels.FIT = fit_path()
    lines = io.StringIO()
    with contextlib.redirect_stdout(lines):
        for path in [p for p in SWEEPS if "_more_" not in p]:  # the tuner's candidates
            validate_levels.choices(path)
    print(lines.getvalue(), end="")
    ratios = [line.split("|")[2:7:4] for line in lines.getvalue().splitlines()]
    for label, keep in (("4 MiB and above", lambda mib: mib >= 4), ("1 MiB", lambda mib: mib < 4)):
        mine = [float(r.split()[0]) for size, r in ratios if keep(int(size.split()[0]))]
        print(f"\n{label}: chosen / best at most 1.10 in {sum(r <= 1.10 for r in mine)} of "
              f"{len(mine)} rows, 1.00 in {sum(r == 1.0 for r in mine)}")  # fmt: skip
    reproducibility()


def reproducibility() -> None:
    """The rows that both a calibration file and a later sweep measured (same command
    settings, int8 and torch's own): how far the second measurement is from the first."""
    print("\n## The same rows measured twice: sweep / calibration\n")
    print("| file | algorithm | codec | MiB | calibration ms | sweep ms | ratio |")
    print("|---|---|---|---:|---:|---:|---:|")
    within = total = 0
    for sweep in SWEEPS:
        calibration = sweep.replace("sweep_", "calib_")
        if not os.path.exists(calibration):
            continue
        first = {_key(r): r["time_us"] for r in _rows(calibration)}
        for row in _rows(sweep):
            if _key(row) not in first:
                continue
            ratio = row["time_us"] / first[_key(row)]
            name = sweep.removeprefix(f"{HERE}/")
            print(
                f"| {name} | {row['algorithm']} | {row['codec']} | {row['size_bytes'] >> 20} "
                f"| {first[_key(row)] / 1e3:.1f} | {row['time_us'] / 1e3:.1f} | {ratio:.2f} |"
            )
            if row["size_bytes"] >= 4 << 20:
                total += 1
                within += abs(ratio - 1) <= 0.10
    print(f"\nRows of 4 MiB and above whose two measurements are within 10%: {within}/{total}")


def _rows(path: str) -> list[dict]:
    with open(path) as file:
        return json.load(file)["rows"]


def _key(row: dict) -> tuple:
    return row["algorithm"], row["codec"], row["size_bytes"]


if __name__ == "__main__":
    main(sys.argv[1])
