"""The cost model with an efficiency per level (host links, uplinks), against our rows.

    python benchmarks/tuner_2026-11-26/validate_levels.py \
        > benchmarks/tuner_2026-11-26/validation.md

1. Fit on the four calibration files of ``../autotune_2026-11-26`` (int8 and native, 4
   hosts on one switch and 8 in 2 racks, 1-64 MiB), saved as ``fit_levels.json``; every
   row predicted (in sample).
2. Held out by size: fitted on the 1 and 16 MiB rows, predicting the 4 and 64 MiB rows.
3. Held out in time and codec: the explicit rows of ``auto_reduce_scatter_8racks.json``
   (measured in this session, 75 minutes later; codecs none, bf16, int8) predicted by fit 1.
4. The tuner's choice with fit 1 for every ``auto`` row of the sweeps (last session's
   four files and this session's), against the rows measured in the same invocation: the
   chosen pair's own row over the fastest row the request allows.
5. Held out in hosts and codecs: the ``sweep_*.json`` rows (2 hosts, which no fit has
   seen; 4 hosts and 8 hosts in 2 racks with none and int4 besides int8), measured after
   fit 1 was made, predicted by it. (Their ``auto`` rows ran with fit 1 as the tuner's
   fit: ``compare_sweeps.md``.)
"""

from __future__ import annotations

import glob
import json
import sys

import torch

sys.path.insert(0, "benchmarks/sim_2026-11-25")
import validate  # noqa: E402

from commpress.sim import calibrate, tuner  # noqa: E402

HERE = "benchmarks/tuner_2026-11-26"
CALIBRATION = sorted(glob.glob("benchmarks/autotune_2026-11-26/calib_*.json"))
FRESH = f"{HERE}/auto_reduce_scatter_8racks.json"
SWEEPS = sorted(glob.glob("benchmarks/autotune_2026-11-26/auto_*.json")) + [FRESH]
FIT = f"{HERE}/fit_levels.json"
LATER_SWEEPS = sorted(glob.glob(f"{HERE}/sweep_*.json"))


def within(row: dict, limit: float) -> bool:
    """A row's measured error is within ``limit`` (a non-finite one, JSON null, is not)."""
    return row["rel_err"] is not None and row["rel_err"] <= limit


def choices(path: str) -> None:
    with open(path) as file:
        data = json.load(file)
    rows = data["rows"]
    measured = [r for r in rows if r["algorithm"] != "auto" and not r["codec"].startswith("auto")]
    first = rows[0]
    topology = "switch"
    if (first.get("racks") or 1) > 1:
        topology = f"racks:count={first['racks']},uplink={first['uplink']}"
    tuner.configure(topology=topology, link=first["link"].split(",")[0], fit=FIT, shared_cores=2)
    asked = sorted({(r["size_bytes"], r["codec"]) for r in rows if r["algorithm"] == "auto"})
    for size, request in asked:
        world = first["nprocs"]
        numel = size // 4 // (world if first["op"] == "all_gather" else 1)
        choice = tuner.choose(first["op"], numel, torch.float32, world, request)
        if request.startswith("auto"):
            limit = float(request.split("=")[1])
            pool = [r for r in measured if r["size_bytes"] == size and within(r, limit)]
        else:
            pool = [r for r in measured if r["size_bytes"] == size
                    and (r["codec"] == request or r["algorithm"] == "native")]  # fmt: skip
        best = min(pool, key=lambda r: r["time_us"])
        ran = [r for r in measured if r["size_bytes"] == size and r["algorithm"] == choice.algorithm
               and (r["codec"] == choice.codec or choice.algorithm == "native")]  # fmt: skip
        mine = ran[0] if ran else None
        ratio = "not swept" if mine is None else f"{mine['time_us'] / best['time_us']:.2f}"
        if mine is not None and mine not in pool:
            ratio += f" (outside the request: rel_err {_error(mine)})"
        fastest = f"{best['codec']}@{best['algorithm']}, {best['time_us'] / 1e3:.1f} ms"
        name = path.removeprefix("benchmarks/")
        print(f"| {name} | {size >> 20} MiB | {request} | {choice} | {fastest} | {ratio} |")


def main() -> None:
    speeds = calibrate.codec_speeds(validate.CODECS)
    rows = calibrate.read_bench(CALIBRATION)
    fields = calibrate.fit_rows(rows, speeds)
    calibrate.save(FIT, fields)
    print("# The cost model with an efficiency per level\n")
    print(f"Fit 1 (`{FIT}`) on {len(rows)} rows of " + ", ".join(f"`{f}`" for f in CALIBRATION))
    print(f"\n{calibrate.describe(fields)}")
    validate.table(validate.predict(rows, fields), "1. in sample")
    fitted = [r for r in rows if r.size_bytes in (1 << 20, 16 << 20)]
    held = calibrate.fit_rows(fitted, speeds)
    print(f"\n\nFit 2, on the 1 and 16 MiB rows: {calibrate.describe(held)}")
    others = [r for r in rows if r.size_bytes not in (1 << 20, 16 << 20)]
    validate.table(validate.predict(others, held), "2. held out by size: 4 and 64 MiB")
    validate.table(
        validate.predict(calibrate.read_bench([FRESH]), fields), "3. held out: a later sweep"
    )
    print("\n## 4. The tuner's choice with fit 1 against the measured rows\n")
    print("| file | size | codec asked | chosen | fastest allowed | chosen / best |")
    print("|---|---:|---|---|---|---:|")
    for path in SWEEPS:
        choices(path)
    swept = calibrate.read_bench(LATER_SWEEPS)
    validate.table(validate.predict(swept, fields), "5. held out: 2, 4 and 8 hosts, none/int8/int4")


def _error(row: dict) -> str:
    return "not finite" if row["rel_err"] is None else f"{row['rel_err']:.3g}"


if __name__ == "__main__":
    main()
