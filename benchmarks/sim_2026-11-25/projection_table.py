"""The projection table of README.md, from projection.json (ms per call).

python benchmarks/sim_2026-11-25/projection_table.py [PATH]

PATH: another `commpress sim --json` file of the same rows (default: this folder's).
"""

import json
import sys
from pathlib import Path

COLUMNS = [
    ("native", "none"),
    ("ring", "int8"),
    ("ring", "int4"),
    ("backend", "int8"),
    ("backend", "int4"),
    ("multicast", "none"),
    ("multicast", "int8"),
    ("multicast", "int4"),
]
path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "projection.json"
rows = json.loads(path.read_text())["rows"]
times = {(r["nodes"], r["link"], r["op"], r["algorithm"], r["codec"]): r["time_us"] for r in rows}
print("| nodes | link | op | " + " | ".join(f"{a} {c}" for a, c in COLUMNS) + " |")
print("|---:|---|---|" + "---:|" * len(COLUMNS))
for op in ("all_gather", "reduce_scatter"):
    for nodes in (188, 1024):
        for link in ("100gbit", "400gbit"):
            cells = [times.get((nodes, link, op, a, c)) for a, c in COLUMNS]
            text = ["-" if t is None else f"{t / 1e3:.2f}" for t in cells]
            print(f"| {nodes} | {link} | {op} | " + " | ".join(text) + " |")
