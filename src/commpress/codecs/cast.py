"""Codecs that cast to a 16-bit float: one native torch op each way, nothing to fuse.

Casting rounds to nearest even. Values beyond the target's range become +-Inf
(IEEE overflow): for fp16 that is any magnitude of 65520 or more. Such values are
never saturated to a finite number; NaN and +-Inf pass through unchanged. One exception
keeps a round trip finite: fp16 input to ``bf16`` of magnitude 65408 or more, which bf16
would round to 65536 (Inf in fp16), is sent as 65280, the largest bf16 within fp16's
range (an error of at most 224, within the bound).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from commpress.codecs.base import CodecBase, check_numel, is_aligned, view_as_dtype


@dataclasses.dataclass(frozen=True)
class FloatCastCodec(CodecBase):
    """Encode by casting to ``wire_dtype``; decode by casting back (in fp32 precision)."""

    wire_dtype: ClassVar[torch.dtype]
    #: Half an ulp, relative: 2**-(mantissa bits + 1).
    relative_error: ClassVar[float]
    #: Half the subnormal spacing: the absolute error floor near zero.
    absolute_error: ClassVar[float]
    #: Smallest magnitude that rounds to Inf.
    overflow: ClassVar[float]

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        check_numel(numel)
        self.check_dtype(dtype, "dtype")
        return 2 * numel

    def encode(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        flat = self.check_input(x)
        payload = self.payload_buffer(out, flat)
        if torch.finfo(flat.dtype).max < torch.finfo(self.wire_dtype).max:
            flat = self._within_input_range(flat)
        if is_aligned(payload, self.wire_dtype):
            payload.view(self.wire_dtype).copy_(flat)
        else:
            payload.copy_(flat.to(self.wire_dtype).view(torch.uint8))
        return payload

    def _within_input_range(self, flat: torch.Tensor) -> torch.Tensor:
        """``flat`` cast to the wire, each finite value that the cast rounds past the input
        dtype's largest replaced by the largest wire value within it."""
        wire = flat.to(self.wire_dtype)
        largest = torch.finfo(flat.dtype).max
        below = torch.tensor(largest, dtype=self.wire_dtype)
        if below.float() > largest:  # the largest went up in the cast: one step down
            below = torch.nextafter(below, torch.zeros_like(below))
        past = wire.float().abs() > largest
        return torch.where(past & flat.isfinite(), below.copysign(wire), wire)

    def decode(self, payload, numel, dtype, out=None):
        self.check_payload(payload, numel, dtype)
        values = view_as_dtype(payload, self.wire_dtype)
        if out is None:
            return values.to(dtype, copy=True)
        result = self.output(out, numel, dtype, payload.device)
        if result.is_neg():  # torch's copy_ of fp16 into a lazy negation drops the sign
            values = values.to(dtype)
        return result.copy_(values)

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        magnitude = self.check_input(x).float().abs()
        bound = magnitude * self.relative_error + self.absolute_error
        return torch.where(magnitude >= self.overflow, torch.inf, bound)
