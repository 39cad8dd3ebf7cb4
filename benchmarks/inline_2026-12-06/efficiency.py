"""Issue 12's efficiency relative to native's from an ``ab.py`` table: for each compressed
row, (its ideal / its time) over (native's ideal / native's time), where an ideal is the
bytes a rank receives over the link rate, so the ratio is
``wire(int8 shard) / bytes(fp32 shard) * native time / time``.

``python benchmarks/inline_2026-12-06/efficiency.py FILE...``"""

from __future__ import annotations

import re
import sys

import torch

import commpress as cp

ROW = re.compile(r"\| (\d+) MiB \| all_gather \| (\S+) \| (\w+) \| ([\d.]+) \|")
HOSTS = re.compile(r"(\d+) hosts at ")  # ab.py's first line; 4 where a file lacks it


def relative_efficiencies(path: str) -> list[tuple[int, str, str, float]]:
    times, ranks = {}, 4
    with open(path) as lines:
        for line in lines:
            if hosts := HOSTS.match(line):
                ranks = int(hosts[1])
            if match := ROW.match(line):
                times[int(match[1]), match[2], match[3]] = float(match[4])
    rows = []
    for (mib, spec, variant), time in sorted(times.items()):
        if variant == "native":
            continue
        shard = mib * 2**20 // 4 // ranks
        codec = cp.get_codec(spec.split("@")[0])
        ratio = codec.wire_bytes(shard, torch.float32) / (shard * 4)
        rows.append((mib, spec, variant, ratio * times[mib, spec, "native"] / time))
    return rows


if __name__ == "__main__":
    print("| file | size | spec | variant | efficiency / native's |")
    print("|---|---:|---|---|---:|")
    for path in sys.argv[1:]:
        for mib, spec, variant, relative in relative_efficiencies(path):
            name = path.rsplit("/", 1)[-1]
            print(f"| {name} | {mib} MiB | {spec} | {variant} | {relative:.3f} |")
