"""The tuner's choices against the best measured, from `commpress bench --json` files that
hold explicit rows and `auto` rows of the same sweep.

    python benchmarks/autotune_2026-11-26/compare.py FILE.json [...]

Per size and per requested codec (an explicit codec, or ``auto:...``): the fastest explicit
row among those the request allows (that codec; for ``auto:max_rel_err=E``, every explicit
codec whose measured ``rel_err`` is at most E), the pair the tuner chose, that pair's own
explicit row over the fastest ("chosen / best"; flagged where that row's measured error is
outside the request, "not swept" where the sweep has no such row) and the ``auto`` row
itself over the fastest ("auto / best", a separate measurement of the same pair).
"""

from __future__ import annotations

import json
import math
import sys


def allowed(request: str, row: dict) -> bool:
    if request.startswith("auto:max_rel_err="):
        limit = float(request.split("=")[1])  # a non-finite error, JSON null, is not within
        error = math.inf if row["rel_err"] is None else row["rel_err"]
        return not row["codec"].startswith("auto") and error <= limit
    return row["codec"] == request or row["algorithm"] == "native"


def main() -> None:
    print("| file | size | codec asked | chosen | fastest measured | chosen / best | auto / best |")
    print("|---|---:|---|---|---|---:|---:|")
    for path in sys.argv[1:]:
        with open(path) as file:
            rows = json.load(file)["rows"]
        explicit = [
            r for r in rows if r["algorithm"] != "auto" and not r["codec"].startswith("auto")
        ]
        for auto in (r for r in rows if r["algorithm"] == "auto"):
            size, request = auto["size_bytes"], auto["codec"]
            pool = [r for r in explicit if r["size_bytes"] == size and allowed(request, r)]
            if request == "none":
                pool = [r for r in pool if r["codec"] == "none"]
            best = min(pool, key=lambda r: r["time_us"])
            codec, algorithm = auto["chosen"].split("@")
            mine = next(
                (
                    r
                    for r in explicit
                    if r["size_bytes"] == size
                    and r["algorithm"] == algorithm
                    and (r["codec"] == codec or algorithm == "native")
                ),
                None,
            )
            if mine is None:
                chosen = "not swept"
            else:
                chosen = f"{mine['time_us'] / best['time_us']:.2f}"
                if mine not in pool:
                    chosen += f" (outside the request: rel_err {_error(mine)})"
            print(
                f"| {path.rsplit('/', 1)[-1]} | {size >> 20} MiB | {request} | {auto['chosen']} "
                f"| {best['codec']}@{best['algorithm']}, {best['time_us'] / 1e3:.1f} ms "
                f"| {chosen} | {auto['time_us'] / best['time_us']:.2f} |"
            )


def _error(row: dict) -> str:
    return "not finite" if row["rel_err"] is None else f"{row['rel_err']:.3g}"


if __name__ == "__main__":
    main()
