"""The multicast rows' protocol-thread CPU and sends of `measure.sh`'s invocations:
``python cpu.py DIR``. Per configuration, size and codec, each version's median over the
invocations of ``cpu_progress_us`` (ms per call, as `commpress bench` reports it) and of
``tx_packets`` (a host's packets per call, the mean over hosts; a segmented send counts as
one)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def medians(folder: Path, config: str, version: str) -> dict:
    found = {}
    for path in sorted(folder.glob(f"{config}_run*_{version}.json")):
        for row in json.loads(path.read_text())["rows"]:
            if row["algorithm"] == "multicast":
                key = (row["size_bytes"] >> 20, row["codec"])
                cpu, packets = row["cpu_progress_us"] / 1e3, statistics.mean(row["tx_packets"])
                found.setdefault(key, []).append((cpu, packets))
    return {
        key: (statistics.median(c for c, _ in rows), statistics.median(p for _, p in rows))
        for key, rows in found.items()
    }


def main(folder: Path) -> None:
    print("| hosts | MiB | codec | CPU before (ms) | after | packets before | after |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for config in ("2hosts", "4hosts", "8racks"):
        before, after = medians(folder, config, "before"), medians(folder, config, "after")
        for key in sorted(before):
            (cpu0, packets0), (cpu1, packets1) = before[key], after[key]
            print(f"| {config} | {key[0]} | {key[1]} | {cpu0:.1f} | {cpu1:.1f} "
                  f"| {packets0:.0f} | {packets1:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
