"""``PYTHONPATH=benchmarks/rs_chunks_2026-11-23 python benchmarks/rs_chunks_2026-11-23/run.py
local|RATE [CODEC]``: 4 local processes, or 4 emulated hosts with RATE links (root)."""

import sys

from chunkbench import measure

from commpress.cluster import cluster_for
from commpress.cluster.local import run_distributed

if __name__ == "__main__":
    sizes = [4 << 20, 16 << 20, 64 << 20]
    chunks = [2 << 20, 4 << 20, 8 << 20]
    codec = sys.argv[2] if len(sys.argv) > 2 else "int8"
    if sys.argv[1] == "local":
        rows = run_distributed(measure, 4, sizes, chunks, codec, timeout=900)[0]
    else:
        with cluster_for(4, sys.argv[1]) as cluster:
            rows = cluster.run(measure, sizes, chunks, codec, timeout=900)[0]
    for size, label, t in rows:
        print(f"{size:>3}M {label:>9} {t * 1e3:8.1f} ms")
