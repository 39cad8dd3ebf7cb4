"""What one tensor view costs from Python, and one codec call on a 64K-element fp32 shard
against its C kernel alone: the figures behind this folder's README.

``python benchmarks/views_2026-11-27/view_costs.py`` (no root; run nothing else meanwhile).
Microseconds per operation, the best of 5 repeats of 2000 (``timeit``).
"""

from __future__ import annotations

import timeit

import torch

from commpress.codecs import get_codec, native
from commpress.codecs.blockwise import streams

REPEATS, NUMBER = 5, 2000


def best_us(call) -> float:
    return min(timeit.repeat(call, number=NUMBER, repeat=REPEATS)) / NUMBER * 1e6


def main() -> None:
    torch.set_num_threads(1)
    rows = torch.empty(4, 70000, dtype=torch.uint8)
    flat = torch.empty(1 << 18)
    print("| tensor operation | us |\n|---|---:|")
    for name, call in (
        ("1-D slice `flat[100:5000]`", lambda: flat[100:5000]),
        ("2-D slice `rows[1, 64:66000]`", lambda: rows[1, 64:66000]),
        ("`flat.view(-1)`", lambda: flat.view(-1)),
        ("slice viewed as fp32 `rows[0, :4096].view(torch.float32)`",
         lambda: rows[0, :4096].view(torch.float32)),
        ("`flat.data_ptr()`", lambda: flat.data_ptr()),
    ):  # fmt: skip
        print(f"| {name} | {best_us(call):.2f} |")

    print("\n| codec, 64K fp32 elements | public call (us) | C kernel alone (us) |")
    print("|---|---:|---:|")
    for spec in ("int8", "int4", "fp8"):
        for row in _codec_rows(spec):
            print(row)


def _codec_rows(spec: str, numel: int = 65536, block: int = 256) -> list[str]:
    codec = get_codec(spec)
    x, out = torch.randn(numel), torch.empty(numel)
    payload = codec.encode(x)
    nblocks = numel // block
    scales, codes = payload[: 4 * nblocks].view(torch.float32), payload[4 * nblocks :]
    staged_scales = torch.empty(nblocks)
    encode, decode = native.kernel(codec.native_encode), native.kernel(codec.native_decode)

    def kernel_encode():
        encode(x, None, nblocks, block, codec.qmax, staged_scales, codes)

    def kernel_decode():
        decode(scales, codes, nblocks, block, codec.qmax, out, streams(out))  # as since fd5ace8

    def public_encode():
        codec.encode(x, out=payload)

    def public_decode():
        codec.decode(payload, numel, torch.float32, out=out)

    return [
        f"| {spec} encode | {best_us(public_encode):.1f} | {best_us(kernel_encode):.1f} |",
        f"| {spec} decode | {best_us(public_decode):.1f} | {best_us(kernel_decode):.1f} |",
    ]


if __name__ == "__main__":
    main()
