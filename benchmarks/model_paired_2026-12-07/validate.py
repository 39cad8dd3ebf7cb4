"""The cost model fitted on the first interleaved sweep and checked against the second.

    python benchmarks/model_paired_2026-12-07/validate.py \
        > benchmarks/model_paired_2026-12-07/validation.md

(``validate.py DIR > DIR/validation.md`` reads and writes another run's folder, as
``measure.sh DIR`` makes it.)

The fit (`fit.json`) reads run 1's int8 and torch's own rows (2 and 4 hosts on one switch,
8 hosts in 2 racks; 1-64 MiB) and this VM's codec speeds (`codecs.json`), as
`commpress sim --calibrate` reads bench rows. Then, rows of 4 MiB and above within 10%:
run 1 in sample; run 2 held out (another invocation), for every codec (none and int4 are
held out by codec too); and the yardstick, run 2 against run 1 itself.
"""

from __future__ import annotations

import collections
import glob
import sys

sys.path.insert(0, "benchmarks/sim_2026-11-25")
import validate  # noqa: E402

from commpress.sim import calibrate  # noqa: E402

HERE = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/model_paired_2026-12-07"
FITTED_CODECS = ("int8", "none")  # int8 rows and torch's own ("none", algorithm native)


def key(row) -> tuple:
    return (row.topology.nodes, str(row.topology), row.op, row.algorithm, row.codec,
            row.size_bytes)  # fmt: skip


def fitted(row) -> bool:
    return row.codec == "int8" or row.algorithm == "native"


def counts(pairs) -> dict:
    """Rows of 4 MiB and above within 10%, by (hosts, op, algorithm, codec)."""
    within = collections.defaultdict(lambda: [0, 0])
    for row, predicted in pairs:
        if row.size_bytes >= 4 << 20:
            cell = within[(row.topology.nodes, row.op, row.algorithm, row.codec)]
            cell[0] += abs(predicted / row.time_s - 1) <= 0.10
            cell[1] += 1
    return within


def summary(title: str, columns: dict[str, dict]) -> None:
    print(f"\n## {title}\n")
    names = list(columns)
    print("| hosts | op | algorithm | codec | " + " | ".join(names) + " |")
    print("|---:|---|---|---|" + "---:|" * len(names))
    cells = sorted(set().union(*columns.values()))
    totals = {name: [0, 0] for name in names}
    for cell in cells:
        shown = []
        for name in names:
            good, total = columns[name].get(cell, (0, 0))
            totals[name][0] += good
            totals[name][1] += total
            shown.append(f"{good}/{total}" if total else "")
        hosts, op, algorithm, codec = cell
        print(f"| {hosts} | {op} | {algorithm} | {codec} | " + " | ".join(shown) + " |")
    print("| all | | | | " + " | ".join(f"**{g}/{t}**" for g, t in totals.values()) + " |")


def main() -> None:
    speeds = calibrate.codec_speeds(f"{HERE}/codecs.json")
    first = calibrate.read_bench(sorted(glob.glob(f"{HERE}/sweep_*_run1.json")))
    second = calibrate.read_bench(sorted(glob.glob(f"{HERE}/sweep_*_run2.json")))
    fields = calibrate.fit_rows([row for row in first if fitted(row)], speeds)
    calibrate.save(f"{HERE}/fit.json", fields)
    every = calibrate.fit_rows(first, speeds)
    calibrate.save(f"{HERE}/fit_every_codec.json", every)
    print("# The cost model on interleaved sweeps: fitted on run 1, checked on run 2\n")
    print(f"Fit on run 1's int8 and torch's own rows (`fit.json`): {calibrate.describe(fields)}")
    print(f"\nFit on every row of run 1 (`fit_every_codec.json`): {calibrate.describe(every)}")
    in_sample = validate.predict([row for row in first if fitted(row)], fields)
    held_out = validate.predict(second, fields)
    run_one = {key(row): row.time_s for row in first}
    yardstick = [(row, run_one[key(row)]) for row in second if key(row) in run_one]
    summary(
        "Rows of 4 MiB and above within 10%",
        {
            "fit.json, run 1 (in sample)": counts(in_sample),
            "fit.json, run 2 (held out)": counts(held_out),
            "fit_every_codec.json, run 2 (held out)": counts(validate.predict(second, every)),
            "run 1 against run 2": counts(yardstick),
        },
    )
    validate.table(held_out, "Every row of run 2 against the model (held out)")
    validate.table(yardstick, "Every row of run 2 against run 1 (the 'predicted' column)")


if __name__ == "__main__":
    main()
