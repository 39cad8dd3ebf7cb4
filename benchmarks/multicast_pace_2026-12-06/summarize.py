"""The table of README.md from the JSON of ``measure.sh``: the median over three invocations
of each variant's multicast time (each invocation's own median of 5 calls), in ms."""

import collections
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
VARIANTS = ("before-k3", "after-k3", "after-k2")


def main() -> None:
    times = collections.defaultdict(list)
    for path in sorted(HERE.glob("pace_*.json")):
        variant = path.stem.removeprefix("pace_").rsplit("_", 1)[0]
        for row in json.loads(path.read_text())["rows"]:
            times[variant, row["algorithm"], row["size_bytes"]].append(row["time_us"] / 1e3)
    print("| size | K=3 before | K=3 after | K=2 after | ring (all 9) | before / after, K=3 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size in sorted({key[2] for key in times}):
        runs = {v: times[v, "multicast", size] for v in VARIANTS}
        median = {v: statistics.median(runs[v]) for v in VARIANTS}
        ring = statistics.median(x for v in VARIANTS for x in times[v, "ring", size])
        cells = [f"{median[v]:.0f} ({', '.join(f'{x:.0f}' for x in runs[v])})" for v in VARIANTS]
        ratio = median["before-k3"] / median["after-k3"]
        print(f"| {size >> 20} MiB | {' | '.join(cells)} | {ring:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
