"""The codecs at an earlier commit against the working tree: every encode and decode
bit for bit the same.

``python benchmarks/overhead_2026-11-27/bit_identity.py COMMIT``: int8, int4 and fp8
(stochastic rounding, other blocks, the reference implementation too), fp32/bf16/fp16
inputs, sizes with and without a tail, payloads at byte offsets 0, 1 and 4 of a buffer,
decoded to fp32 and to the input's dtype; then five stochastic encodes in a row.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from ab import extract  # noqa: E402

SPECS = ("int8", "int4", "fp8", "int8:stochastic=true,seed=3", "int4:block=64",
         "int8:impl=reference", "fp8:block=32")  # fmt: skip
SIZES = (0, 1, 255, 256, 512, 700, 4096, 5000)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.numel() else b.numel() == 0


def main(commit: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        extract(commit, Path(scratch))
        sys.path.insert(0, scratch)
        old, new = importlib.import_module("commpress_before"), importlib.import_module("commpress")
        cases = 0
        for spec in SPECS:
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                for n in SIZES:
                    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
                    for offset in (0, 1, 4):
                        before, after = old.get_codec(spec), new.get_codec(spec)
                        size = after.wire_bytes(n, dtype)
                        a = torch.zeros(size + offset, dtype=torch.uint8)
                        b = a.clone()
                        before.encode(x, out=a[offset:])
                        after.encode(x, out=b[offset:])
                        assert torch.equal(a, b), (spec, dtype, n, offset)
                        for to in (torch.float32, dtype):
                            decoded = (
                                before.decode(a[offset:], n, to),
                                after.decode(b[offset:], n, to),
                            )
                            assert same(*decoded), (spec, dtype, n, offset, to)
                        cases += 1
        before, after = old.get_codec(SPECS[3]), new.get_codec(SPECS[3])
        x = torch.randn(1024)
        for _ in range(5):
            assert torch.equal(before.encode(x), after.encode(x)), "stochastic sequence"
        print(f"{commit} and the working tree: bit for bit the same in {cases} cases")


if __name__ == "__main__":
    main(sys.argv[1])
