"""``none``: the identity. Any dtype, the raw bytes on the wire, bit-exact."""

from __future__ import annotations

import dataclasses

import torch

from commpress.codecs.base import CodecBase, check_numel, check_tensor, view_as_dtype
from commpress.codecs.registry import register


@register
@dataclasses.dataclass(frozen=True)
class NoneCodec(CodecBase):
    name = "none"
    lossless = True
    input_dtypes = None

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        check_numel(numel)
        self.check_dtype(dtype, "dtype")
        return numel * dtype.itemsize

    def encode(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        flat = self.check_input(x)  # of stride 1, which view(uint8) needs
        return self.payload_buffer(out, flat).copy_(flat.view(torch.uint8))

    def decode(self, payload, numel, dtype, out=None):
        self.check_payload(payload, numel, dtype)
        values = view_as_dtype(payload, dtype)
        if out is None:
            return values.clone()
        return self.output(out, numel, dtype, payload.device).copy_(values)

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor(x, "x")
        return torch.zeros(x.numel(), dtype=torch.float32, device=x.device)
