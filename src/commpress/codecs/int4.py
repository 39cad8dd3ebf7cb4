"""``int4``: block-wise absmax quantization to 4-bit integers in [-7, 7], two per byte.

Wire size: ``ceil(numel / 2) + 4 * ceil(numel / block)`` bytes (about 7.76x smaller
than fp32 at the default block of 256). Code ``q`` is stored as the nibble
``q + 8``; element ``2i`` in the low nibble of byte ``i``, ``2i + 1`` in the high one.
Error per element: at most ``absmax / 14`` with round-to-nearest, ``absmax / 7``
with ``stochastic=true``. Blocks with NaN or +-Inf decode to NaN.
``block`` must be even so that no byte straddles two blocks.
"""

from __future__ import annotations

import dataclasses

import torch

from commpress.codecs import blockwise
from commpress.codecs.kernels import kernel
from commpress.codecs.registry import register

QMAX = 7.0
OFFSET = 8


@kernel
def encode_int4(blocks, noise, scales_out, codes_out):
    absmax, q = blockwise.quantize_to_integers(blocks, noise, QMAX)
    nibbles = (q + OFFSET).to(torch.uint8).view(blocks.shape[0], -1, 2)
    scales_out.copy_(absmax)
    codes_out.copy_(nibbles[:, :, 0] | (nibbles[:, :, 1] << 4))


@kernel
def decode_int4(absmax: torch.Tensor, codes: torch.Tensor, out: torch.Tensor):
    nibbles = torch.stack((codes & 0xF, codes >> 4), dim=2).view(codes.shape[0], -1)
    out.copy_(blockwise.unscale(nibbles.float() - OFFSET, absmax, QMAX).view(-1))


@register
@dataclasses.dataclass(frozen=True)
class Int4Codec(blockwise.IntegerBlockCodec):
    name = "int4"
    qmax = QMAX
    encode_kernel = encode_int4
    decode_kernel = decode_int4
    native_encode = "encode_int4"
    native_decode = "decode_int4"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block % 2:
            raise ValueError(f"int4 needs an even block, got block={self.block}")

    def code_bytes(self, numel: int) -> int:
        return (numel + 1) // 2
