"""The fixed rule "the ring with the codec asked" scored as `compare.py` scores the tuner:
its row over the fastest explicit row of that codec (native included), on section 4's
sweeps.

    python benchmarks/tuner_2026-11-26/ring_rule.py > benchmarks/tuner_2026-11-26/ring_rule.txt
"""

import glob
import json

RATIOS: dict[str, list[float]] = {"1 MiB": [], "4 MiB and above": []}

for path in sorted(glob.glob("benchmarks/tuner_2026-11-26/sweep_*.json")):
    with open(path) as file:
        rows = [r for r in json.load(file)["rows"] if r["algorithm"] != "auto"]
    for size in sorted({r["size_bytes"] for r in rows}):
        for codec in ("none", "int8", "int4"):
            pool = [r for r in rows if r["size_bytes"] == size
                    and (r["codec"] == codec or r["algorithm"] == "native")]  # fmt: skip
            best = min(r["time_us"] for r in pool)
            ring = next(r for r in pool if r["algorithm"] == "ring")
            RATIOS["1 MiB" if size == 1 << 20 else "4 MiB and above"].append(ring["time_us"] / best)

for sizes, ratios in RATIOS.items():
    print(
        f"{sizes}: {len(ratios)} rows, 1.00 in {sum(r <= 1.0001 for r in ratios)}, at most 1.06 "
        f"in {sum(r <= 1.06 for r in ratios)}, above 1.10 in {sum(r > 1.10 for r in ratios)}, "
        f"worst {max(ratios):.2f}"
    )
