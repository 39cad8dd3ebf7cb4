"""The CPU cost of one call of a codec's torch.compile'd kernel, on this machine's CPU: the
Python and dynamo around the compiled graph that a CUDA encode also pays (the block codecs
on CUDA always go through torch.compile). Usage: python compiled_call_cpu.py [ROUNDS]"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import commpress as cp

CALLS = 2000


def _us_per_call(fn) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - start) / CALLS * 1e6


def _patch():
    with torch._dynamo.config.patch(recompile_limit=64):  # what kernels.py did before
        pass


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    x = torch.randn(4096)
    rows = {"dynamo config patch": _patch}
    for spec in ("int8", "int4"):
        codec = cp.get_codec(f"{spec}:impl=compiled")
        payload = codec.encode(x)
        codec.decode(payload, x.numel(), x.dtype)
        rows[f"{spec} encode, 4096 elements"] = lambda c=codec: c.encode(x)
        rows[f"{spec} decode, 4096 elements"] = lambda c=codec, p=payload: c.decode(
            p, x.numel(), x.dtype
        )
    for fn in rows.values():
        _us_per_call(fn)  # warm
    samples = {name: [] for name in rows}
    for _ in range(rounds):
        for name, fn in rows.items():
            samples[name].append(_us_per_call(fn))
    print(f"| call (impl=compiled, CPU) | us per call, median of {rounds} rounds of {CALLS} |")
    print("|---|---|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values):.1f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
