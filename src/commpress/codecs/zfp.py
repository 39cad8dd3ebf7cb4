"""``zfp:rate=R``: ZFP fixed-rate compression (R bits per value), through ``zfpy``, on the CPU.

The codec of the MPI compression work (MVAPICH's default is rate 16). Tensors on
another device travel through host memory. Needs ``pip install 'commpress[zfp]'``.

Payload: ``[int32 exponent][non-finite bitmap][zfp stream]``.

* ``zfpy`` 1.0.1 returns garbage for magnitudes below about 1e-28 and crashes for
  rate 1, so the input is first scaled by an exact power of two that brings its
  absmax to [0.5, 1), and ``rate`` must lie in [3, 32].
* ZFP turns NaN and Inf into finite numbers, so each group of 256 elements has a
  flag bit: a group holding a non-finite value decodes to all-NaN.

Error: ZFP's fixed-rate mode has no closed-form bound. The bound used here,
``max|zfp block of 4| * 2**(7 - R) + absmax * 2**-80``, was measured on Gaussian,
Student-t, uniform and tiny-magnitude data with a 2x margin, and is what the
tests assert. Rates below 8 give errors as large as the values themselves.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from commpress.codecs.base import CodecBase, check_numel, view_as_dtype
from commpress.codecs.blockwise import num_blocks, pad_to_blocks
from commpress.codecs.registry import register

ZFP_BLOCK = 4
FLAG_GROUP = 256
MIN_RATE, MAX_RATE = 3.0, 32.0
EXPONENT_BYTES = 4
#: zfp spends at least a sign bit and an 8-bit exponent per float block.
MIN_BLOCK_BITS = 9


def _zfpy():
    try:
        import zfpy
    except ImportError:
        raise ImportError(
            "codec 'zfp' needs the zfpy package: pip install 'commpress[zfp]' "
            "(or pip install zfpy==1.0.1)"
        ) from None
    return zfpy


@register
@dataclasses.dataclass(frozen=True)
class ZfpCodec(CodecBase):
    name = "zfp"
    idempotent = False  # re-encoding a decoded tensor changes its bits

    #: Bits per value, in [3, 32].
    rate: float = 16.0

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)):
            raise TypeError(f"rate must be a number, got {self.rate!r}")
        if not MIN_RATE <= self.rate <= MAX_RATE:
            raise ValueError(f"rate must be in [{MIN_RATE:g}, {MAX_RATE:g}], got {self.rate!r}")
        _zfpy()

    def _stream_bytes(self, numel: int) -> int:
        bits_per_block = max(math.floor(ZFP_BLOCK * self.rate + 0.5), MIN_BLOCK_BITS)
        return 8 * -(-num_blocks(numel, ZFP_BLOCK) * bits_per_block // 64)

    def _flag_bytes(self, numel: int) -> int:
        return -(-num_blocks(numel, FLAG_GROUP) // 8)

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        check_numel(numel)
        self.check_dtype(dtype, "dtype")
        if numel == 0:
            return 0
        return EXPONENT_BYTES + self._flag_bytes(numel) + self._stream_bytes(numel)

    def encode(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        flat = self.check_input(x)
        result = self.payload_buffer(out, flat)
        n = flat.numel()
        if n == 0:
            return result
        values = flat.detach().to(device="cpu", dtype=torch.float32)
        finite = torch.isfinite(values)
        values = torch.where(finite, values, 0.0)
        _, exponent = torch.frexp(values.abs().max())
        scaled = torch.ldexp(values, -exponent)
        stream = _zfpy().compress_numpy(scaled.numpy(), rate=self.rate, write_header=False)
        if len(stream) != self._stream_bytes(n):
            raise RuntimeError(
                f"zfpy wrote {len(stream)} bytes where fixed rate {self.rate} implies "
                f"{self._stream_bytes(n)}: unsupported zfpy version?"
            )
        bad_groups = pad_to_blocks(~finite, FLAG_GROUP).any(dim=1).numpy()
        flags = np.packbits(bad_groups, bitorder="little")
        payload = torch.cat(
            (
                exponent.to(torch.int32).view(1).view(torch.uint8),
                torch.from_numpy(flags),
                torch.frombuffer(bytearray(stream), dtype=torch.uint8),
            )
        )
        return result.copy_(payload)

    def decode(self, payload, numel, dtype, out=None):
        self.check_payload(payload, numel, dtype)
        result = self.output(out, numel, dtype, payload.device)
        if numel == 0:
            return result
        host = payload.cpu()
        exponent = view_as_dtype(host[:EXPONENT_BYTES], torch.int32)
        flag_end = EXPONENT_BYTES + self._flag_bytes(numel)
        zfpy = _zfpy()
        decoded = zfpy._decompress(
            host[flag_end:].numpy().tobytes(),
            zfpy.dtype_to_ztype(np.dtype(np.float32)),
            [numel],
            rate=self.rate,
        )
        # a value near fp32's largest can decode just past it, to Inf: every value came
        # from a finite one (the non-finite are flagged below)
        largest = torch.finfo(torch.float32).max
        values = torch.ldexp(torch.from_numpy(decoded), exponent).clamp_(-largest, largest)
        values = self._saturate_within_reach(values, dtype)
        bad_groups = np.unpackbits(host[EXPONENT_BYTES:flag_end].numpy(), bitorder="little")
        bad = torch.from_numpy(bad_groups.astype(bool)).repeat_interleave(FLAG_GROUP)[:numel]
        values[bad] = torch.nan
        if result.is_neg():  # torch's copy_ of fp32 into an fp16 lazy negation drops the sign
            values = values.to(dtype)
        return result.copy_(values)

    def _saturate_within_reach(self, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A 16-bit ``dtype``'s data near its largest can decode just past it (by at most
        the error bound's share of the block's largest), which the cast would make Inf:
        values within that reach go to the largest, whatever type they came from (the
        payload does not say); a value farther out came from wider data and casts to Inf."""
        largest = torch.finfo(dtype).max
        if largest >= torch.finfo(torch.float32).max:
            return values
        reach = largest * (1 + 2.0 ** (7 - self.rate))
        return torch.where(values.abs() <= reach, values.clamp(-largest, largest), values)

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        magnitude = self.check_input(x).float().abs()
        block_max = pad_to_blocks(magnitude, ZFP_BLOCK).amax(dim=1)
        block_max = block_max.repeat_interleave(ZFP_BLOCK)[: magnitude.numel()]
        global_max = magnitude.max() if magnitude.numel() else magnitude.new_zeros(())
        return block_max * 2.0 ** (7 - self.rate) + global_max * 2.0**-80
