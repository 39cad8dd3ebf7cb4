"""Ring time over multicast time (above 1: multicast is faster) per network, size and codec,
from the JSON files that ``sweep.sh`` wrote, as a markdown table; plus the multicast rows'
repairs, the share of the machine's cores that the ranks' processes kept busy
(``nprocs`` x process CPU per call / (cores x time per call); the CPU is a mean over the
calls and the time their median, so one slow call can push it past 1; in JSON written
before ``64bc0a1`` the CPU also counted the barrier before each call and the reduction of
its time) and CPU per call.

    python benchmarks/multicast_2026-11-25/summarize.py [DIR]   (default: this folder)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
NETWORKS = (
    "racks_200m_100m_mtu9000",
    "racks_200m_100m_mtu1500",
    "racks_1g_500m_mtu9000",
    "racks_1g_500m_mtu1500",
    "racks_1g_1g_mtu9000",
    "racks_1g_2g_mtu9000",
    "switch8_1g_mtu9000_roots8",
    "switch8_1g_mtu9000",
    "switch4_1g_mtu9000_roots4",
    "switch4_1g_mtu9000",
    "switch4_1g_mtu1500",
    "switch8_200m_mtu9000",
    "switch8_200m_mtu9000_roots8",
    "switch4_200m_mtu9000",
    "switch4_200m_mtu9000_roots4",
)


def rows_of(name: str) -> list[dict]:
    return json.loads((HERE / f"{name}.json").read_text())["rows"]


def cores_of(name: str) -> int:
    machine = json.loads((HERE / f"{name}.json").read_text())["provenance"]["machine"]
    return int(re.search(r"(\d+) cores", machine).group(1))


def busy(row: dict, cores: int) -> str:
    return f"{row['nprocs'] * row['cpu_process_us'] / (cores * row['time_us']):.2f}"


def main() -> None:
    print(
        "| network | size | ring/multicast, none | ring/multicast, int8 | repairs/call "
        "| cores busy, multicast none/int8 |"
    )
    print("|---|---|---|---|---|---|")
    for name in NETWORKS:
        if not (HERE / f"{name}.json").exists():
            continue
        rows = rows_of(name)
        times = {(r["algorithm"], r["codec"], r["size_bytes"]): r for r in rows}
        for size in sorted({r["size_bytes"] for r in rows}):
            ratios = []
            for codec in ("none", "int8"):
                ring, mc = times.get(("ring", codec, size)), times.get(("multicast", codec, size))
                ratios.append(f"{ring['time_us'] / mc['time_us']:.2f}" if ring and mc else "-")
            repairs = [
                f"{times[('multicast', c, size)]['repairs']:.0f}"
                for c in ("none", "int8")
                if ("multicast", c, size) in times
            ]
            cores = cores_of(name)
            shares = [
                busy(times[("multicast", c, size)], cores)
                for c in ("none", "int8")
                if ("multicast", c, size) in times
            ]
            cells = [name, f"{size >> 20} MiB", *ratios, "/".join(repairs), "/".join(shares)]
            print("| " + " | ".join(cells) + " |")
    if not (HERE / "racks_1g_500m_mtu9000.json").exists():
        return
    print()
    print("CPU per call, ms (mean over ranks): caller thread, communication thread, multicast")
    print("thread, whole process; racks_1g_500m_mtu9000")
    print("| size | algorithm | codec | caller | comm | multicast | process |")
    print("|---|---|---|---|---|---|---|")
    for row in rows_of("racks_1g_500m_mtu9000"):
        if row["algorithm"] == "native":
            continue
        cpu = [row[f"cpu_{k}_us"] / 1e3 for k in ("caller", "comm", "progress", "process")]
        print(
            f"| {row['size_bytes'] >> 20} MiB | {row['algorithm']} | {row['codec']} | "
            + " | ".join(f"{c:.1f}" for c in cpu)
            + " |"
        )


if __name__ == "__main__":
    main()
