"""Small messages before and after: ``python small.py DIR PREFIX AFTER`` reads
``PREFIX_{2,4}hosts_run*_{before,AFTER}.json`` and prints, per hosts, algorithm, codec and
size, the median over the invocations of each version's time (ms), after / before, and
every invocation's time."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def times(folder: Path, prefix: str, hosts: int, version: str) -> dict:
    found = {}
    for path in sorted(folder.glob(f"{prefix}_{hosts}hosts_run*_{version}.json")):
        for row in json.loads(path.read_text())["rows"]:
            key = (row["algorithm"], row["codec"], row["size_bytes"] >> 20)
            found.setdefault(key, []).append(row["time_us"] / 1e3)
    return found


def main(folder: Path, prefix: str, after: str) -> None:
    print(f"| hosts | algorithm | codec | MiB | before ms | {after} ms | ratio "
          f"| before, each | {after}, each |")  # fmt: skip
    print("|---:|---|---|---:|---:|---:|---:|---|---|")
    for hosts in (2, 4):
        old, new = times(folder, prefix, hosts, "before"), times(folder, prefix, hosts, after)
        for key in sorted(old):
            if key[0] == "native":
                continue
            a, b = statistics.median(old[key]), statistics.median(new[key])
            each = [" ".join(f"{t:.2f}" for t in version[key]) for version in (old, new)]
            print(f"| {hosts} | {key[0]} | {key[1]} | {key[2]} | {a:.2f} | {b:.2f} "
                  f"| {b / a:.3f} | {each[0]} | {each[1]} |")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
