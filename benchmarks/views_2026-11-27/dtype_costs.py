"""One int8 encode and decode per input dtype on the CPU: the 16-bit dtypes still widen to
fp32 for the C kernels (a copy and a fresh buffer per call) and make their views.

``python benchmarks/views_2026-11-27/dtype_costs.py`` (no root; run nothing else
meanwhile). Microseconds per call, the best of 5 repeats (``timeit``).
"""

from __future__ import annotations

import timeit

import torch

from commpress.codecs import get_codec


def best_us(call, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def main() -> None:
    torch.set_num_threads(1)
    codec = get_codec("int8")
    print("| elements | dtype | encode (us) | decode (us) |\n|---:|---|---:|---:|")
    for numel in (65536, 1 << 20):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = torch.randn(numel).to(dtype)
            payload, out = codec.encode(x), torch.empty(numel, dtype=dtype)
            number = max(20, (1 << 21) // numel)
            encode = best_us(lambda: codec.encode(x, out=payload), number)  # noqa: B023
            decode = best_us(lambda: codec.decode(payload, numel, dtype, out=out), number)  # noqa: B023
            name = str(dtype).removeprefix("torch.")
            print(f"| {numel} | {name} | {encode:.0f} | {decode:.0f} |")


if __name__ == "__main__":
    main()
