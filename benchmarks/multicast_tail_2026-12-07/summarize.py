"""Ring time over multicast time (above 1: multicast is faster), before and after the
change, from the invocations ``measure.sh`` made: the median of each algorithm's times over
the three invocations of each variant, and each invocation's own ratio.

    cd benchmarks/multicast_tail_2026-12-07 && python summarize.py > summary.md
"""

from __future__ import annotations

import collections
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def times_of(network: str, variant: str) -> dict[tuple[int, str, str], list[float]]:
    """(size, algorithm, codec) -> time per call (ms) of every invocation of ``variant``."""
    times = collections.defaultdict(list)
    for path in sorted(HERE.glob(f"{network}_{variant}_*.json")):
        for row in json.loads(path.read_text())["rows"]:
            times[row["size_bytes"], row["algorithm"], row["codec"]].append(row["time_us"] / 1e3)
    return times


def main() -> None:
    networks = sorted({path.name.rsplit("_", 2)[0] for path in HERE.glob("*_before_*.json")})
    columns = "network size codec variant ring_(ms) multicast_(ms) ring_/_multicast runs"
    print("| " + " | ".join(c.replace("_", " ") for c in columns.split()) + " |")
    print("|---|---:|---|---|---:|---:|---:|---|")
    for network in networks:
        by_variant = {variant: times_of(network, variant) for variant in ("before", "after")}
        keys = sorted(key for key in by_variant["after"] if key[1] == "ring")
        for size, _, codec in keys:
            for variant, times in by_variant.items():
                ring, multicast = times[size, "ring", codec], times[size, "multicast", codec]
                ratios = ", ".join(f"{r / m:.2f}" for r, m in zip(ring, multicast, strict=True))
                ring_ms, multicast_ms = statistics.median(ring), statistics.median(multicast)
                print(
                    f"| {network} | {size >> 20} MiB | {codec} | {variant} | {ring_ms:.1f} | "
                    f"{multicast_ms:.1f} | {ring_ms / multicast_ms:.2f} | {ratios} |"
                )


if __name__ == "__main__":
    main()
