"""``fp8``: e4m3 floating-point codes with one fp32 absmax per block.

Each block is scaled so that its absmax maps to 448, the largest finite e4m3 value,
then rounded to e4m3 (3 mantissa bits, round to nearest even). Wire size:
``numel + 4 * ceil(numel / block)`` bytes. Error per element: at most
``|x| / 16 + absmax / 448 * 2**-10`` (relative half-ulp for normal codes, half
the subnormal spacing below 2**-6). Blocks with NaN or +-Inf decode to NaN; note
that torch's own fp8 cast would silently saturate Inf to 448, which this codec
never does.
"""

from __future__ import annotations

import dataclasses

import torch

from commpress.codecs import blockwise
from commpress.codecs.kernels import kernel
from commpress.codecs.registry import register

QMAX = 448.0
FP8 = torch.float8_e4m3fn


@kernel
def encode_fp8(blocks, noise, scales_out, codes_out):
    blocks = blocks.float()
    absmax = blockwise.block_absmax(blocks)
    scales_out.copy_(absmax.view(-1))
    codes_out.copy_(blockwise.scale_to_grid(blocks, absmax, QMAX).to(FP8).view(torch.uint8))


def widened(codes: torch.Tensor) -> torch.Tensor:
    """e4m3 codes as fp32, the NaN codes (S.1111.111) as the canonical NaN with their sign:
    eager torch widens them to 0x7ff00000 and inductor to 0x7fc00000, so that each path
    would decode another NaN."""
    q = codes.view(FP8).float()
    return torch.where(torch.isnan(q), torch.copysign(torch.full_like(q, torch.nan), q), q)


@kernel
def decode_fp8(absmax: torch.Tensor, codes: torch.Tensor, out: torch.Tensor):
    q = widened(codes)
    out.copy_(blockwise.unscale(q, absmax, QMAX).view(-1))


@register
@dataclasses.dataclass(frozen=True)
class Fp8Codec(blockwise.BlockScaledCodec):
    name = "fp8"
    qmax = QMAX
    relative_error = 2.0**-4
    encode_kernel = encode_fp8
    decode_kernel = decode_fp8
    native_encode = "encode_fp8"
    native_decode = "decode_fp8"

    @property
    def grid_error(self) -> float:
        return 2.0**-10
