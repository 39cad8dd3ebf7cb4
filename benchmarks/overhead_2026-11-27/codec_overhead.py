"""Thread CPU per ``encode``/``decode`` call of fp32 values, and of the bare C kernel
beneath a decode: what the Python around the kernel costs.

``python benchmarks/overhead_2026-11-27/codec_overhead.py``: int8, int4 and fp8 at 16K and
64K elements (whole blocks of 256), ``out=`` given; the median of 5 runs of 2000 calls.
"""

from __future__ import annotations

import statistics
import time

import torch

from commpress.codecs import get_codec, native
from commpress.codecs.blockwise import streams

CALLS = 2000


def per_call_us(call) -> float:
    for _ in range(20):
        call()
    runs = []
    for _ in range(5):
        start = time.thread_time()
        for _ in range(CALLS):
            call()
        runs.append((time.thread_time() - start) / CALLS * 1e6)
    return statistics.median(runs)


def measure(spec: str, numel: int) -> str:
    codec = get_codec(spec)
    x, out = torch.randn(numel), torch.empty(numel)
    payload = codec.encode(x)
    decode = per_call_us(lambda: codec.decode(payload, numel, torch.float32, out=out))
    encode = per_call_us(lambda: codec.encode(x, out=payload))
    rows = numel // codec.block
    scales = payload[: 4 * rows].view(torch.float32)
    codes = payload[4 * rows :].view(rows, -1)
    kernel = native.kernel(codec.native_decode)
    stream = streams(out)  # as codec.decode asks (since fd5ace8)
    bare = per_call_us(lambda: kernel(scales, codes, rows, codec.block, codec.qmax, out, stream))
    return (
        f"{spec} n={numel}: decode {decode:.1f} us, encode {encode:.1f} us, "
        f"bare decode kernel {bare:.1f} us"
    )


def main() -> None:
    torch.set_num_threads(1)
    for spec in ("int8", "int4", "fp8"):
        for numel in (16384, 65536):
            print(measure(spec, numel))


if __name__ == "__main__":
    main()
