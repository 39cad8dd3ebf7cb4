"""``fp16``: cast to IEEE half (11 significand bits, max 65504). 2x smaller than fp32.

Error per element: at most ``|x| * 2**-11 + 2**-25`` for ``|x| < 65520``;
larger magnitudes overflow to +-Inf, as an IEEE cast does (documented, tested).
fp16 input is carried bit-exact.
"""

from __future__ import annotations

import dataclasses

import torch

from commpress.codecs.cast import FloatCastCodec
from commpress.codecs.registry import register


@register
@dataclasses.dataclass(frozen=True)
class Fp16Codec(FloatCastCodec):
    name = "fp16"
    wire_dtype = torch.float16
    relative_error = 2.0**-11
    absolute_error = 2.0**-25
    overflow = 65520.0
