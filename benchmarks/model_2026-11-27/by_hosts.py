"""Rows of 4 MiB and above within 10%, by host count and by who moves the bytes.

    python benchmarks/model_2026-11-27/by_hosts.py

Reads the tables of ``fit*.md`` (in sample) and ``sweeps*.md`` (held out) that
``validate.py`` wrote: gloo's own collectives (``native``, and ``backend`` and ``alltoall``,
which hand their payloads to gloo's all-gather and all-to-all) apart from commpress's
point-to-point schedules and the multicast.
"""

from __future__ import annotations

import collections

HERE = "benchmarks/model_2026-11-27"
GLOO_OWN = ("native", "backend", "alltoall")


def counts(name: str, section: str) -> dict:
    within = collections.defaultdict(lambda: [0, 0])
    current = ""
    with open(f"{HERE}/{name}.md") as file:
        for line in file:
            if line.startswith("## "):
                current = line
            cells = [cell.strip() for cell in line.split("|")]
            if section not in current or len(cells) < 11 or not cells[2].isdigit():
                continue
            if int(cells[7]) < 4:
                continue
            who = "gloo's own" if cells[5] in GLOO_OWN else "commpress p2p, multicast"
            mine = within[(int(cells[2]), who)]
            mine[0] += abs(float(cells[10].rstrip("%"))) <= 10
            mine[1] += 1
    return within


def main() -> None:
    print("| rows | hosts | who moves the bytes | before the exchange level | after |")
    print("|---|---:|---|---:|---:|")
    for label, names, section in (
        ("in sample", ("fit_before_exchange", "fit"), "in sample"),
        ("held out: later sweeps", ("sweeps_before_exchange", "sweeps"), "later sweeps"),
    ):
        before, after = (counts(name, section) for name in names)
        for key in sorted(after):
            b, a = before[key], after[key]
            print(f"| {label} | {key[0]} | {key[1]} | {b[0]}/{b[1]} | {a[0]}/{a[1]} |")


if __name__ == "__main__":
    main()
