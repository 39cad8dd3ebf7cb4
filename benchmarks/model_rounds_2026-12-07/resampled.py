"""What the noise of the rounds alone allows: the rows of 4 MiB and above that two runs,
or a model exact to the rows' true times, would get within 10%, were every round of a row
drawn from the same distribution (both runs' rounds pooled).

    python benchmarks/model_rounds_2026-12-07/resampled.py DIR [ROUNDS]

For each row of a model sweep (``DIR/sweep_*_run1.json`` and ``run2``), both runs' rounds
are pooled and resampled with replacement (2000 times, seed 0), ROUNDS a run (default:
as many as the runs had): "two runs" is the chance that two such medians are within 10%
of each other (what ``validate.py``'s "run 1 against run 2" column counts, here expected
from the spread alone), "a model exact" the chance that the pooled rounds' median
(taken for the row's true time, as a model's prediction) is within 10% of one such median,
counted as ``validate.py`` counts a prediction. Both assume a run's rounds independent of
each other; a run's rows share an offset (a sitting) that pooling removes, so they are
upper bounds. "Keeping each run's offset": rows whose measured runs differ by a ratio r
with |log r| / sqrt(2) <= log 1.1 (each run's error taken as half of the difference's
variance: an exact model's chance of landing within 10% of one run). Summed over the
rows: expected counts of rows.
"""

from __future__ import annotations

import glob
import json
import sys

import numpy as np

SAMPLES = 2000
SMALLEST = 4 << 20


def rows_of(folder: str, run: int) -> dict:
    rows = {}
    for path in sorted(glob.glob(f"{folder}/sweep_*_run{run}.json")):
        with open(path) as file:
            data = json.load(file)
        for row in data["rows"] if isinstance(data, dict) else data:
            key = (row["nprocs"], row.get("racks"), row["op"], row["algorithm"], row["codec"],
                   row["size_bytes"])  # fmt: skip
            rows[key] = row["seconds"]
    return rows


def main() -> None:
    folder = sys.argv[1]
    first, second = rows_of(folder, 1), rows_of(folder, 2)
    keys = sorted(k for k in first.keys() & second.keys() if k[-1] >= SMALLEST)
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else len(first[keys[0]])
    generator = np.random.default_rng(0)
    runs_agree = exact_agrees = offsets_kept = 0.0
    for key in keys:
        pooled = np.array(first[key] + second[key])
        one, other = (
            np.median(generator.choice(pooled, (SAMPLES, rounds)), axis=1) for _ in range(2)
        )
        runs_agree += np.mean(np.abs(other / one - 1) <= 0.10)
        exact_agrees += np.mean(np.abs(np.median(pooled) / one - 1) <= 0.10)
        ratio = np.median(second[key]) / np.median(first[key])
        offsets_kept += abs(np.log(ratio)) / np.sqrt(2) <= np.log(1.1)
    print(
        f"{folder}: {len(keys)} rows of 4 MiB and above, {rounds} rounds a run: two runs "
        f"within 10% in {runs_agree:.1f} (expected), a model exact to the pooled medians in "
        f"{exact_agrees:.1f}; keeping each run's offset (as measured) {offsets_kept:.0f}"
    )


if __name__ == "__main__":
    main()
