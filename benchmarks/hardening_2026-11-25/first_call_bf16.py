"""The first int8 encode + decode of bf16 values in a fresh process, per implementation.

    python benchmarks/hardening_2026-11-25/first_call_bf16.py

Each implementation runs in a process of its own (a compiled kernel is cached per
process), on one thread: three calls of encode + decode of 1M bf16 values.
"""

from __future__ import annotations

import subprocess
import sys

CALLS = 3
CHILD = """
import sys, time, torch, commpress as cp
torch.set_num_threads(1)
codec = cp.get_codec("int8:impl=" + sys.argv[1])
x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
for _ in range({calls}):
    start = time.perf_counter()
    codec.decode(codec.encode(x), x.numel(), torch.bfloat16)
    print(f"{{(time.perf_counter() - start) * 1e3:.1f}}")
"""


def main() -> None:
    print("| impl | " + " | ".join(f"call {i + 1} (ms)" for i in range(CALLS)) + " |")
    print("|---|" + "---:|" * CALLS)
    for impl in ("fused", "compiled"):
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(calls=CALLS), impl],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"| {impl} | " + " | ".join(done.stdout.split()) + " |")


if __name__ == "__main__":
    main()
