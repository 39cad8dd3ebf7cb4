"""What the noise of the rounds alone allows: the rows of 4 MiB and above that two runs,
or a model exact to the rows' true times, would get within 10%, were every round of a row
drawn from the same distribution (both runs' rounds pooled).

    python benchmarks/model_rounds_2026-12-07/resampled.py DIR [ROUNDS]

For each row of a model sweep (``DIR/sweep_*_run1.json`` and ``run2``), both runs' rounds
are pooled and resampled with replacement (2000 times, seed 0), ROUNDS a run (default:
as many as the runs had): "two runs" is the chance that two such medians are within 10%
of each other (what ``validate.py``'s "run 1 against run 2" column counts, here expected
from the spread alone), "a model exact" the chance that one such median is within 10% of
the pooled rounds' median (the most a model could get held out, were the pooled median the
row's true time). Summed over the rows: an expected count of rows.
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
    runs_agree = exact_agrees = 0.0
    for key in keys:
        pooled = np.array(first[key] + second[key])
        one, other = (
            np.median(generator.choice(pooled, (SAMPLES, rounds)), axis=1) for _ in range(2)
        )
        runs_agree += np.mean(np.abs(other / one - 1) <= 0.10)
        exact_agrees += np.mean(np.abs(one / np.median(pooled) - 1) <= 0.10)
    print(
        f"{folder}: {len(keys)} rows of 4 MiB and above, {rounds} rounds a run: two runs "
        f"within 10% in {runs_agree:.1f} (expected), a model exact to the pooled medians in "
        f"{exact_agrees:.1f}"
    )


if __name__ == "__main__":
    main()
