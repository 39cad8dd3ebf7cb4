"""Ring time over multicast time (above 1: multicast is faster), the median of each
algorithm's times over the invocations ``measure.sh`` made, per network, size and codec.

    python benchmarks/multicast_rerun_2026-12-06/summarize.py [FOLDER]

FOLDER: where the invocations' JSON files are (default: this script's own), for a later
run (``benchmarks/multicast_int8_2026-12-06/``, ``benchmarks/multicast_200m_2026-12-07/``):
its networks are the names of its ``NETWORK_runK.json`` files.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent


def times_of(folder: Path, network: str) -> dict[tuple[int, str, str], list[float]]:
    """(size, algorithm, codec) -> time per call (ms) of every invocation."""
    times = collections.defaultdict(list)
    for path in sorted(folder.glob(f"{network}_run*.json")):
        for row in json.loads(path.read_text())["rows"]:
            key = row["size_bytes"], row["algorithm"], row["codec"]
            times[key].append(row["time_us"] / 1e3)
    return times


def main(folder: Path = HERE) -> None:
    print("| network | size | codec | ring (ms) | multicast (ms) | ring / multicast | runs |")
    print("|---|---:|---|---:|---:|---:|---|")
    for network in sorted({path.name.rsplit("_run", 1)[0] for path in folder.glob("*_run*.json")}):
        times = times_of(folder, network)
        for size, algorithm, codec in sorted(times):
            if algorithm != "ring":
                continue
            ring, multicast = times[size, "ring", codec], times[size, "multicast", codec]
            ratios = ", ".join(f"{r / m:.2f}" for r, m in zip(ring, multicast, strict=True))
            ring_ms, multicast_ms = statistics.median(ring), statistics.median(multicast)
            print(
                f"| {network} | {size >> 20} MiB | {codec} | {ring_ms:.1f} | "
                f"{multicast_ms:.1f} | {ring_ms / multicast_ms:.2f} | {ratios} |"
            )


if __name__ == "__main__":
    main(*(Path(folder) for folder in sys.argv[1:2]))
