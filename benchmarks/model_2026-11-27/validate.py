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

import glob
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
    for path in SWEEPS:
        validate_levels.choices(path)


if __name__ == "__main__":
    main(sys.argv[1])
