"""The cost model, recalibrated on this VM, against its calibration rows and later sweeps.

    python benchmarks/model_2026-11-27/validate.py PHASE > benchmarks/model_2026-11-27/OUT.md

PHASE ``fit``: fit on this folder's ``calib_*.json`` (int8 and torch's own, 2 and 4 hosts
on one switch, 8 hosts in 2 racks, 1-64 MiB; codec speeds from ``codecs.json``), saved as
``fit.json``; every calibration row predicted (in sample), then the rows held out by size
(fitted on 1 and 16 MiB, predicting 4 and 64 MiB). PHASE ``sweeps``: the ``sweep_*.json``
rows (codecs none, int8, int4, measured after the fit) predicted by ``fit.json``, and the
tuner's choice for their ``auto`` rows against the rows of the same invocation (with
``fit_tuner.json``, the fit they ran with), and the rows measured twice. PHASE ``repeat``:
the sweeps against their repetition ``repeat_*.json`` (``sweeps.sh repeat``). Run with
``PYTHONPATH`` at another checkout to see that checkout's model on the same rows (its fit
is then written to and read from ``fit_other.json``).
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys

sys.path.insert(0, "benchmarks/sim_2026-11-25")
import torch  # noqa: E402
import validate  # noqa: E402

from commpress.sim import calibrate, tuner  # noqa: E402

HERE = "benchmarks/model_2026-11-27"
CODECS = f"{HERE}/codecs.json"
CALIBRATION = sorted(glob.glob(f"{HERE}/calib_*.json"))
SWEEPS = sorted(glob.glob(f"{HERE}/sweep_*.json"))
#: what sweeps.sh ran the tuner on (another checkout: its own fit)
TUNER_FIT = f"{HERE}/fit_tuner.json"
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
    if phase == "repeat":
        repeat()
        return
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
    tuner_table([p for p in SWEEPS if "_more_" not in p])  # the tuner's candidates
    reproducibility(fields)


def tuner_table(paths: list[str]) -> None:
    global TUNER_FIT
    if fit_path() != f"{HERE}/fit.json":
        TUNER_FIT = fit_path()
    print("\n## The tuner's choices against the rows of the same invocation\n")
    if TUNER_FIT.endswith("fit_tuner.json"):
        print(f"The tuner's fit: `{TUNER_FIT}`, the one the sweeps ran with (before the")
        print("`calib_more_*` rows).")
    else:
        print(f"The tuner's fit: `{TUNER_FIT}`, this checkout's own: not the one the sweeps")
        print("ran with, so `offline` may differ from `ran`.")
    print("`ran`: the pair the `auto` row ran, and that row's time; `explicit`: the same")
    print("pair's own explicit row; both over the fastest explicit row the request allows")
    print("(native included). `offline`: the tuner's choice recomputed here.\n")
    print("| file | size | codec asked | ran | offline | fastest allowed | ran / best "
          "| explicit / best |")  # fmt: skip
    print("|---|---:|---|---|---|---|---:|---:|")
    ratios = {"ran": [], "explicit": []}
    for path in paths:
        for size, ran, explicit in choices(path):
            ratios["ran"].append((size, ran))
            ratios["explicit"].append((size, explicit))
    for name, pairs in ratios.items():
        for label, large in (("4 MiB and above", True), ("1 MiB", False)):
            mine = [r for size, r in pairs if (size >= 4 << 20) == large]
            within, best = sum(r <= 1.10 for r in mine), sum(r <= 1.0 for r in mine)
            print(f"\n{name} / best, {label}: at most 1.10 in {within} of {len(mine)} rows, "
                  f"at most 1.00 in {best}")  # fmt: skip


def choices(path: str) -> list[tuple]:
    """Per ``auto`` row of ``path``: its size, its own time and its pair's explicit row's
    time over the fastest explicit row the request allows (a table row printed)."""
    rows = _rows(path)
    measured = [r for r in rows if r["algorithm"] != "auto" and not r["codec"].startswith("auto")]
    first = rows[0]
    topology = "switch"
    if (first.get("racks") or 1) > 1:
        topology = f"racks:count={first['racks']},uplink={first['uplink']}"
    link = first["link"].split(",")[0]
    tuner.configure(topology=topology, link=link, fit=TUNER_FIT, shared_cores=2)
    out = []
    for auto in [r for r in rows if r["algorithm"] == "auto"]:
        size, request = auto["size_bytes"], auto["codec"]
        world = first["nprocs"]
        numel = size // 4 // (world if first["op"] == "all_gather" else 1)
        offline = tuner.choose(first["op"], numel, torch.float32, world, request)
        pool = [r for r in measured if r["size_bytes"] == size
                and (r["codec"] == request or r["algorithm"] == "native")]  # fmt: skip
        best = min(pool, key=lambda r: r["time_us"])
        codec, _, algorithm = auto["chosen"].partition("@")
        (explicit,) = [r for r in measured if r["size_bytes"] == size
                       and r["algorithm"] == algorithm
                       and (r["codec"] == codec or algorithm == "native")]  # fmt: skip
        ran, mine = auto["time_us"] / best["time_us"], explicit["time_us"] / best["time_us"]
        name = path.removeprefix(f"{HERE}/")
        fastest = f"{best['codec']}@{best['algorithm']}, {best['time_us'] / 1e3:.1f} ms"
        print(f"| {name} | {size >> 20} MiB | {request} | {auto['chosen']} | {offline} "
              f"| {fastest} | {ran:.2f} | {mine:.2f} |")  # fmt: skip
        out.append((size, ran, mine))
    return out


def repeat() -> None:
    """The sweeps against their repetition (``repeat_*.json``, same commands): how far each
    row moved, and the model's errors against each and against the mean of the two."""
    fields = calibrate.load(fit_path())
    print(f"Fit `{fit_path()}`\n")
    counts = collections.defaultdict(lambda: [0, 0, 0, 0, 0])  # codec -> the counts below
    for sweep in [p for p in SWEEPS if "_more_" not in p]:
        again = sweep.replace("sweep_", "repeat_")
        first, second = calibrate.read_bench([sweep]), calibrate.read_bench([again])
        times = {(r.algorithm, r.codec, r.size_bytes): r.time_s for r in second}
        for row, predicted in validate.predict(first, fields):
            if row.size_bytes < 4 << 20:
                continue
            other = times[(row.algorithm, row.codec, row.size_bytes)]
            mean = (row.time_s + other) / 2
            mine = counts[row.codec]
            mine[0] += 1
            mine[1] += abs(other / row.time_s - 1) <= 0.10
            mine[2] += abs(predicted / row.time_s - 1) <= 0.10
            mine[3] += abs(predicted / other - 1) <= 0.10
            mine[4] += abs(predicted / mean - 1) <= 0.10
    print("Rows of 4 MiB and above of `sweep_*.json` (not `sweep_more_*`) and `repeat_*.json`:\n")
    print("| codec | rows | repeat within 10% of sweep | model within 10% of sweep "
          "| of repeat | of their mean |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    total = [0] * 5
    for codec, mine in sorted(counts.items()):
        print(f"| {codec} | " + " | ".join(map(str, mine)) + " |")
        total = [a + b for a, b in zip(total, mine, strict=True)]
    print("| all | " + " | ".join(map(str, total)) + " |")
    tuner_table(sorted(glob.glob(f"{HERE}/repeat_*.json")))


def reproducibility(fields: dict) -> None:
    """The rows that both a calibration file and a later sweep measured (same command
    settings, int8 and torch's own): how far the second measurement is from the first,
    and how far the model (``fields``) is from the second."""
    print("\n## The same rows measured twice: sweep / calibration\n")
    print("| file | algorithm | codec | MiB | calibration ms | sweep ms | ratio |")
    print("|---|---|---|---:|---:|---:|---:|")
    within = total = model_within = 0
    predicted = {
        (r.source, r.algorithm, r.codec, r.size_bytes): t
        for r, t in validate.predict(calibrate.read_bench(SWEEPS), fields)
    }
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
                model = predicted[(sweep, row["algorithm"], row["codec"], row["size_bytes"])]
                model_within += abs(model / (row["time_us"] * 1e-6) - 1) <= 0.10
    print(f"\nRows of 4 MiB and above whose two measurements are within 10%: {within}/{total};")
    print(f"the model (fitted on the first measurements) within 10% of the second: "
          f"{model_within}/{total}")  # fmt: skip


def _rows(path: str) -> list[dict]:
    with open(path) as file:
        return json.load(file)["rows"]


def _key(row: dict) -> tuple:
    return row["algorithm"], row["codec"], row["size_bytes"]


if __name__ == "__main__":
    main(sys.argv[1])
