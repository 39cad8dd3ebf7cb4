"""The C kernels of ``blockquant.c`` at an earlier commit against the working tree's, on
one core: encode and decode of 1M fp32 values, from and into memory in the caches (the
same buffer every call) and not (a new one of 48 each call, 192 MiB in all).

``python benchmarks/streaming_2026-12-06/kernels.py COMMIT [FLAG...]`` (the working tree's
decodes with non-temporal stores asked for and not; medians of 5 repeats of 48 calls, in
ms). FLAGs go to the compiler for both builds: ``-mno-avx512f`` measures the kernels a CPU
without AVX-512 runs (AVX2 here)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from commpress.codecs import native

NUMEL, BLOCK, BUFFERS, REPEATS = 1 << 20, 256, 48, 5
ROWS = NUMEL // BLOCK
FORMATS = (("int8", 127.0, 1.0), ("int4", 7.0, 0.5), ("fp8", 448.0, 1.0))
REPOSITORY = Path(__file__).resolve().parents[2]


def _library_at(commit: str, into: Path, flags: tuple[str, ...]):
    source = into / "blockquant.c"
    source.write_bytes(
        subprocess.run(
            ["git", "-C", str(REPOSITORY), "show", f"{commit}:src/commpress/codecs/blockquant.c"],
            check=True,
            capture_output=True,
        ).stdout
    )
    return native.build(flags, source=source)


def _ms(call, buffers) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for buffer in buffers:
            call(buffer)
        times.append((time.perf_counter() - start) / len(buffers) * 1e3)
    return statistics.median(times)


def _row(kernel: str, version: str, call, buffers: list[torch.Tensor]) -> str:
    hot, cold = _ms(call, [buffers[0]] * BUFFERS), _ms(call, buffers)
    return f"| {kernel} | {version} | {hot:.3f} | {cold:.3f} |"


def main(commit: str, *flags: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        before = _library_at(commit, Path(scratch), flags)
    after = native.build(flags)
    buffers = [torch.randn(NUMEL) for _ in range(BUFFERS)]
    scales = torch.rand(ROWS) * 3
    built = f", both built with {' '.join(flags)}" if flags else ""
    print(f"1M fp32 values, block {BLOCK}, one core; before = {commit}, after = this tree{built}")
    print("| kernel | version | in the caches (ms) | not (ms) |")
    print("|---|---|---:|---:|")
    for name, qmax, code_bytes in FORMATS:
        codes = torch.empty(int(NUMEL * code_bytes), dtype=torch.uint8)
        kernel = f"encode_{name}"
        for version, library in (("before", before), ("after", after)):
            encode = native.wrap(library, kernel)

            def encoding(x, encode=encode, qmax=qmax, codes=codes):
                encode(x, None, ROWS, BLOCK, qmax, scales, codes)

            print(_row(kernel, version, encoding, buffers))
        kernel = f"decode_{name}"
        for version, library, stream in (
            ("before", before, ()),
            ("after, plain stores", after, (0,)),
            ("after, non-temporal stores", after, (1,)),
        ):
            decode = native.wrap(library, kernel)

            def decoding(out, decode=decode, qmax=qmax, codes=codes, stream=stream):
                decode(scales, codes, ROWS, BLOCK, qmax, out, *stream)

            print(_row(kernel, version, decoding, buffers))


if __name__ == "__main__":
    main(*sys.argv[1:])
