"""Seconds per test directory and per test file from pytest's JUnit XML, side by side.

``python benchmarks/test_suite_2026-11-27/summarize.py BEFORE.xml AFTER.xml`` prints a
markdown table: each file's summed test time (setup, call and teardown) in each run.
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ElementTree


def seconds_per_file(path: str) -> tuple[dict[str, float], int, int]:
    """Summed seconds per test file, the number of tests and of failures."""
    per_file: dict[str, float] = collections.Counter()
    tests = failures = 0
    for case in ElementTree.parse(path).iter("testcase"):
        per_file[case.get("classname").replace(".", "/") + ".py"] += float(case.get("time"))
        tests += 1
        failures += case.find("failure") is not None or case.find("error") is not None
    return per_file, tests, failures


def main(paths: list[str]) -> None:
    runs = [seconds_per_file(path) for path in paths]
    print("| file | " + " | ".join(paths) + " |")
    print("|---|" + "---:|" * len(paths))
    directories: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * len(paths))
    files = sorted(set().union(*(per_file for per_file, _, _ in runs)))
    for name in sorted(files, key=lambda name: -runs[0][0].get(name, 0.0)):
        row = [per_file.get(name, 0.0) for per_file, _, _ in runs]
        for i, seconds in enumerate(row):
            directories["/".join(name.split("/")[:2])][i] += seconds
        print(f"| {name} | " + " | ".join(f"{seconds:.1f}" for seconds in row) + " |")
    for name, row in sorted(directories.items()):
        print(f"| **{name}** | " + " | ".join(f"{seconds:.1f}" for seconds in row) + " |")
    totals = [sum(per_file.values()) for per_file, _, _ in runs]
    print("| **all** | " + " | ".join(f"{seconds:.1f}" for seconds in totals) + " |")
    counts = [f"{tests} tests, {failures} failed" for _, tests, failures in runs]
    print("| tests | " + " | ".join(counts) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
