"""Medians of the before/after runs: ``python summarize.py`` prints a markdown table."""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def rows(label: str, pattern: str) -> dict:
    found: dict = {}
    for path in sorted((HERE / label).glob(pattern)):
        data = json.loads(path.read_text())
        for row in data["rows"] if isinstance(data, dict) else data:
            found.setdefault((row["algorithm"], row["codec"]), []).append(row)
    return found


HEAD = "op | size | algorithm | codec | before: ms (3 runs) | after: ms (3 runs) | after / before"
print(f"| {HEAD} | efficiency before → after |")
print("|---|---:|---|---|---|---|---:|---|")
for op, size in (("all_gather", "64M"), ("reduce_scatter", "64M"), ("all_gather", "1M")):
    pattern = f"{op}_{size}_run*.json"
    before, after = rows("before", pattern), rows("after", pattern)
    for key in before:
        b = [r["time_us"] / 1e3 for r in before[key]]
        a = [r["time_us"] / 1e3 for r in after[key]]
        eb = statistics.median(r["efficiency"] for r in before[key])
        ea = statistics.median(r["efficiency"] for r in after[key])
        ratio = statistics.median(a) / statistics.median(b)
        print(
            f"| {op} | {size} | {key[0]} | {key[1]} | {statistics.median(b):.1f} "
            f"({', '.join(f'{x:.1f}' for x in b)}) | {statistics.median(a):.1f} "
            f"({', '.join(f'{x:.1f}' for x in a)}) | {ratio:.2f} | {eb:.2f} → {ea:.2f} |"
        )
