"""Before/after table of `measure.sh`'s invocations: ``python summarize.py DIR``.

Per configuration, size and algorithm+codec: the median over the invocations of each
version's time (each invocation's own median of 5 calls), after / before, the efficiency
(ideal / time) of each, and for the multicast the bytes the busiest host sent beyond what
its schedule says (``wire_bytes``: its shard): framing, ENDs, ACKs and repairs.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

CONFIGS = {"2hosts": "2 hosts, 1 Gbit/s", "4hosts": "4 hosts, 1 Gbit/s",
           "8racks": "8 hosts, 2 racks, uplinks 500 Mbit/s"}  # fmt: skip


def rows(folder: Path, config: str, version: str) -> dict:
    """(size, algorithm, codec) -> [row of each invocation]."""
    found = defaultdict(list)
    for path in sorted(folder.glob(f"{config}_run*_{version}.json")):
        for row in json.loads(path.read_text())["rows"]:
            found[row["size_bytes"], row["algorithm"], row["codec"]].append(row)
    return found


def extra_sent(row: dict) -> float:
    """What the busiest host sent beyond its schedule's bytes, as a share of them."""
    return max(row["tx_bytes"]) / row["wire_bytes"] - 1


def main(folder: Path) -> None:
    for config, title in CONFIGS.items():
        before, after = rows(folder, config, "before"), rows(folder, config, "after")
        if not before:
            continue
        runs = len(next(iter(before.values())))
        print(f"## {title} ({runs} invocations a version)\n")
        print(
            "| MiB | algorithm | codec | before ms | after ms | after / before "
            "| efficiency before | after | sent beyond the schedule, before | after |"
        )
        print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for key in sorted(before):
            size, algorithm, codec = key
            if algorithm == "native":
                continue
            cells = []
            for version in (before, after):
                times = [row["time_us"] / 1e3 for row in version[key]]
                cells.append(statistics.median(times))
            ideal = before[key][0]["ideal_us"] / 1e3
            extras = []
            for version in (before, after):
                if algorithm == "multicast":
                    share = statistics.median(extra_sent(row) for row in version[key])
                    extras.append(f"{share:+.1%}")
                else:
                    extras.append("")
            print(
                f"| {size >> 20} | {algorithm} | {codec} | {cells[0]:.1f} | {cells[1]:.1f} "
                f"| {cells[1] / cells[0]:.3f} | {ideal / cells[0]:.2f} | {ideal / cells[1]:.2f} "
                f"| {extras[0]} | {extras[1]} |"
            )
        print()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
