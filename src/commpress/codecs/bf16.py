"""``bf16``: cast to bfloat16 (8 significand bits, fp32's exponent range). 2x smaller than fp32.

Error per element: at most ``|x| * 2**-8 + 2**-134`` (the second term: half bf16's
subnormal spacing, for fp32 subnormals). bf16 input is carried bit-exact.
"""

from __future__ import annotations

import dataclasses

import torch

from commpress.codecs.cast import FloatCastCodec
from commpress.codecs.registry import register


@register
@dataclasses.dataclass(frozen=True)
class Bf16Codec(FloatCastCodec):
    name = "bf16"
    wire_dtype = torch.bfloat16
    relative_error = 2.0**-8
    absolute_error = 2.0**-134
    overflow = (2.0 - 2.0**-8) * 2.0**127
