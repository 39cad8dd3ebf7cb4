"""Block-wise absmax quantization shared by the int8, int4 and fp8 codecs.

The input is cut into blocks of ``block`` elements (the last one zero-padded).
Each block stores its absolute maximum ``absmax`` as fp32 and each element as a
code ``q`` on a grid over ``[-qmax, qmax]``:

    encode:  v = x / absmax * qmax        (|v| <= qmax), q = grid(v)
    decode:  x_hat = (q / qmax) * absmax

Decoding as ``(q / qmax) * absmax`` makes the extreme code reproduce ``absmax``
exactly, so blocks that are constant come back bit for bit.

Payload layout: ``[absmax: nblocks x fp32][codes]``; scales first so that they are
4-byte aligned whenever the payload is.

Non-finite values: a block that holds a NaN or an Inf is stored with the canonical NaN
as its absmax and all-zero codes, so *every* element of that block decodes to that NaN
(anything * NaN is NaN), whichever NaN or Inf the input held; encoding the decoded block
again gives the same payload. Non-finite inputs are never turned into finite outputs.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.autograd.graph import increment_version

from commpress.codecs import native, rounding_noise
from commpress.codecs.base import CodecBase, check_numel, is_aligned, view_as_dtype
from commpress.codecs.kernels import Kernel

IMPLEMENTATIONS = ("fused", "compiled", "reference")
#: Slack for fp32 rounding in the scale and unscale steps, as a fraction of absmax.
FP32_SLACK = 2.0**-20
#: Dtypes the native (C, fp32) kernels serve: 16-bit floats are widened to fp32 for them.
NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Elements widened to fp32 at a time for the native kernels (bounds the extra memory).
WIDEN_ELEMENTS = 1 << 20
#: fp32 output bytes from which a native decode asks for non-temporal stores (see
#: :func:`streams`).
STREAM_MIN_BYTES = 1 << 20
#: The largest block: one scale per 16M values already costs nothing; larger ones once
#: overflowed torch's sizes (``block=10**20``).
MAX_BLOCK = 1 << 24


class _StreamingDecodes(threading.local):
    """Whether native decodes on this thread may ask for non-temporal stores."""

    depth = 0  # the ``with`` blocks this thread is inside

    @property
    def on(self) -> bool:
        return self.depth > 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exception) -> None:
        self.depth -= 1


#: ``with streaming_decodes:`` the native decodes on this thread, inside, may write large
#: output past the caches (:func:`streams`): for a caller that writes its output and leaves
#: it to a later reader (an all-gather), not one that reads it back at once (a
#: reduce-scatter adds to what it decodes, error feedback subtracts it).
streaming_decodes = _StreamingDecodes()


def streams(out: torch.Tensor) -> int:
    """Whether a native decode into ``out`` asks the kernel for non-temporal stores (1) or
    not (0): fp32 output of :data:`STREAM_MIN_BYTES` or more, inside
    :data:`streaming_decodes`. The kernel uses them only where it can (AVX-512 or AVX2, a
    block of whole 64-byte lines, ``out`` on a 64-byte line). Into memory not in the caches, they
    decode 1M int8 values in about 0.2 ms against 0.5 through the caches; a reader of the
    output right after finds it in memory, not in a cache: on 4 emulated hosts they made
    the int8 ring all-gather at 8-16 MiB 0.8-2.4 ms faster (AVX2 builds 0.8-1.2; int4
    1.5-3.5 ms) and cost the reduce-scatter CPU (``benchmarks/streaming_2026-12-06/``,
    ``benchmarks/streaming_avx2_2026-12-06/``)."""
    on = streaming_decodes.on and out.dtype == torch.float32
    return int(on and out.numel() * 4 >= STREAM_MIN_BYTES)


def num_blocks(numel: int, block: int) -> int:
    return -(-numel // block)


def pad_to_blocks(flat: torch.Tensor, block: int) -> torch.Tensor:
    """``flat`` zero-padded to whole blocks, shaped ``(nblocks, block)``."""
    n = flat.numel()
    nblocks = num_blocks(n, block)
    return F.pad(flat, (0, nblocks * block - n)).view(nblocks, block)


def _leading(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` rows of ``tensor``: itself when that is all of it (a slice is a
    tensor operation of several microseconds, on every encode and decode)."""
    return tensor if tensor.shape[0] == count else tensor[:count]


def block_absmax(blocks: torch.Tensor) -> torch.Tensor:
    """Per-row absmax of ``(nblocks, block)`` as ``(nblocks, 1)``; one canonical NaN for a
    block that holds a NaN or an Inf (such a block decodes to that NaN, and so does the
    same block encoded again: every hop of ``ring-hop`` keeps its bits)."""
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    return torch.where(torch.isfinite(absmax), absmax, torch.nan)


def scale_to_grid(blocks: torch.Tensor, absmax: torch.Tensor, qmax: float) -> torch.Tensor:
    """``blocks / absmax * qmax``; zero where the block is all zero or has a non-finite absmax."""
    usable = (absmax > 0) & torch.isfinite(absmax)
    return torch.where(usable, blocks / absmax * qmax, 0.0)


def round_to_integers(v: torch.Tensor, noise: torch.Tensor | None, qmax: float) -> torch.Tensor:
    """Round to nearest (ties to even), or stochastically when ``noise`` ~ U[0, 1) is given.

    Stochastic: ``floor(v)``, plus one where ``frac(v) + u >= 1``, which is unbiased: it
    rounds up with probability ``frac(v)``, and never moves a ``v`` on the grid. Not
    ``floor(v + u)``: in fp32, ``v + u`` rounds up to the next integer when ``u`` lies
    within half an ulp of ``v``'s distance to it (``-127 + (1 - 2**-24)`` is -126), which
    moved grid points, a block's own absmax among them, by a step. The clamp catches a
    ``v`` just past ``qmax``, which an approximate division (CUDA's compiled path) can give.
    """
    if noise is None:
        return torch.round(v)
    down = torch.floor(v)
    return torch.clamp(torch.where((v - down) + noise >= 1.0, down + 1.0, down), -qmax, qmax)


def quantize_to_integers(
    blocks: torch.Tensor, noise: torch.Tensor | None, qmax: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax ``(nblocks,)`` and integer codes ``q`` (as floats) of ``(nblocks, block)`` input."""
    blocks = blocks.float()
    absmax = block_absmax(blocks)
    q = round_to_integers(scale_to_grid(blocks, absmax, qmax), noise, qmax)
    return absmax.view(-1), q


def unscale(q: torch.Tensor, absmax: torch.Tensor, qmax: float) -> torch.Tensor:
    return (q / qmax) * absmax


@dataclasses.dataclass(frozen=True)
class BlockScaledCodec(CodecBase):
    """Base of codecs that store one fp32 absmax per block plus one code per element."""

    #: Elements per block; each block costs 4 extra bytes for its absmax.
    block: int = 256
    #: "fused": the fastest available path (native C kernels for fp32, bf16 and fp16 on
    #: the CPU where a C compiler exists, else torch.compile); "compiled": torch.compile only;
    #: "reference": plain torch ops, the specification. All three agree bit for bit.
    impl: str = "fused"

    #: Largest code magnitude: the grid spans [-qmax, qmax].
    qmax: ClassVar[float]
    #: Rounding error as a fraction of |x| (floating-point grids such as fp8).
    relative_error: ClassVar[float] = 0.0
    #: ``encode_kernel(blocks (rows, block), noise (rows, block) or None, scales_out (rows,),
    #: codes_out (rows, code_bytes(block)))`` writes the absmax and the codes of each block.
    encode_kernel: ClassVar[Kernel]
    #: ``decode_kernel(absmax (rows, 1), codes (rows, code_bytes(block)), out (rows * block,))``
    #: writes into ``out`` so that the fused path needs no extra pass over the result.
    decode_kernel: ClassVar[Kernel]
    #: Names of the native (C) twins in blockquant.c, where there are some.
    native_encode: ClassVar[str | None] = None
    native_decode: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.block, bool)
            or not isinstance(self.block, int)
            or not 1 <= self.block <= MAX_BLOCK
        ):
            raise ValueError(
                f"block must be a positive int of at most {MAX_BLOCK}, got {self.block!r}"
            )
        if self.impl not in IMPLEMENTATIONS:
            raise ValueError(f"impl must be one of {IMPLEMENTATIONS}, got {self.impl!r}")

    @property
    def grid_error(self) -> float:
        """Largest rounding error in grid units (v-space) outside the relative part."""
        return 0.5

    def code_bytes(self, numel: int) -> int:
        """Bytes of the codes of ``numel`` elements (after the scales)."""
        return numel

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        check_numel(numel)
        self.check_dtype(dtype, "dtype")
        return 4 * num_blocks(numel, self.block) + self.code_bytes(numel)

    def noise(self, rows: int, device: torch.device) -> torch.Tensor | None:
        """Uniform noise for ``rows`` blocks of stochastic rounding; None for round-to-nearest."""
        return None

    def encode(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        flat = self.check_input(x)
        payload = self.payload_buffer(out, flat)
        fast = self._native(self.native_encode, flat)
        if fast and out is not None:
            increment_version(out)  # C writes by address: autograd must see a change, as for copy_
        if fast and self._encode_by_address(fast, flat, payload):
            return payload
        whole_blocks, tail = divmod(flat.numel(), self.block)
        scale_bytes = 4 * num_blocks(flat.numel(), self.block)
        codes = payload[scale_bytes:]
        # The C kernel writes the scales into the payload where they are aligned there;
        # torch's kernels get them staged and copied in (inductor cannot compile a copy
        # into a float view of a uint8 buffer: an internal assert in torch 2.13)
        in_place = fast is not None and is_aligned(payload, torch.float32)
        if in_place:
            scales = payload[:scale_bytes].view(torch.float32)
        else:
            scales = torch.empty(scale_bytes // 4, dtype=torch.float32, device=flat.device)
        per_block = self.code_bytes(self.block)
        # Kernels see whole blocks only, as a free (rows, block) view: no copy for padding.
        if whole_blocks:
            self._encode_rows(
                fast,
                _leading(flat, whole_blocks * self.block).view(whole_blocks, self.block),
                _leading(scales, whole_blocks),
                _leading(codes, whole_blocks * per_block).view(whole_blocks, per_block),
            )
        if tail:
            whole = whole_blocks * self.block
            tail_codes = codes.new_empty(1, per_block)
            self._encode_rows(
                fast, pad_to_blocks(flat[whole:], self.block), scales[whole_blocks:], tail_codes
            )
            codes[whole_blocks * per_block :] = tail_codes.view(-1)[
                : codes.numel() - whole_blocks * per_block
            ]
        if not in_place:
            payload[:scale_bytes] = scales.view(torch.uint8)
        return payload

    def decode(
        self,
        payload: torch.Tensor,
        numel: int,
        dtype: torch.dtype,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.check_payload(payload, numel, dtype)
        result = self.output(out, numel, dtype, payload.device)
        # The kernels write memory: a lazy negation would show it negated, and autograd
        # would not see the write into an ``out`` that requires grad (a leaf must refuse
        # it, a tensor with a history must lose it): torch's copy_ does both right.
        if result.is_neg() or result.requires_grad:
            return result.copy_(self.decode(payload, numel, dtype))
        fast = self._native(self.native_decode, result)
        if fast and out is not None:
            increment_version(out)  # as in encode: backward then refuses it if it was saved
        if fast and self._decode_by_address(fast, payload, numel, result):
            return result
        whole_blocks, tail = divmod(numel, self.block)
        scale_bytes = 4 * num_blocks(numel, self.block)
        absmax = view_as_dtype(payload[:scale_bytes], torch.float32).view(-1, 1)
        codes = payload[scale_bytes:]
        per_block = self.code_bytes(self.block)
        whole = whole_blocks * self.block
        if whole_blocks:
            self._decode_rows(
                fast,
                _leading(absmax, whole_blocks),
                _leading(codes, whole_blocks * per_block).view(whole_blocks, per_block),
                _leading(result, whole),
            )
        if tail:
            tail_codes = pad_to_blocks(codes[whole_blocks * per_block :], per_block)
            padded = result.new_empty(self.block)
            self._decode_rows(fast, absmax[whole_blocks:], tail_codes, padded)
            result[whole:] = padded[:tail]
        return result

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        flat = self.check_input(x)
        blocks = pad_to_blocks(flat.float(), self.block)
        absmax = block_absmax(blocks).expand_as(blocks).reshape(-1)[: flat.numel()]
        grid = self.grid_error / self.qmax + FP32_SLACK
        return flat.float().abs() * self.relative_error + absmax * grid

    def _native(self, name: str | None, *tensors: torch.Tensor):
        """The native kernel ``name`` if it applies to these CPU float tensors, else None.

        The C kernels read and write fp32; 16-bit tensors go through them widened to fp32
        (see :meth:`_encode_rows`), which is exactly what the reference does first, so no
        dtype ever waits for ``torch.compile`` on the CPU.
        """
        if self.impl != "fused" or name is None:
            return None
        if any(not t.is_cpu or t.dtype not in NATIVE_DTYPES for t in tensors):
            return None
        return native.kernel(name)

    def _encode_by_address(self, fast, flat: torch.Tensor, payload: torch.Tensor) -> bool:
        """The common case, with no tensor view made (each costs microseconds, on every
        call): whole blocks, rounded to nearest, into a payload whose scales are aligned;
        16-bit input widened to fp32 in one copy, up to :data:`WIDEN_ELEMENTS`. False where
        it does not apply; nothing is written or drawn then (a stochastic encode draws its
        noise once, on the other path)."""
        rows, tail = divmod(flat.numel(), self.block)
        start = payload.data_ptr()
        if tail or start % 4 or self.draws_noise or not self._widens_at_once(flat):
            return False
        scales, codes = native.Address(start), native.Address(start + 4 * rows)
        return fast(flat.float(), None, rows, self.block, self.qmax, scales, codes)

    def _decode_by_address(self, fast, payload: torch.Tensor, numel: int, out: torch.Tensor):
        """:meth:`_encode_by_address`'s twin: whole blocks, through one fp32 buffer for
        16-bit output (rounded into it by one copy)."""
        rows, tail = divmod(numel, self.block)
        start = payload.data_ptr()
        if tail or start % 4 or not self._widens_at_once(out):
            return False
        wide = out if out.dtype == torch.float32 else out.new_empty(numel, dtype=torch.float32)
        scales, codes = native.Address(start), native.Address(start + 4 * rows)
        if not fast(scales, codes, rows, self.block, self.qmax, wide, streams(out)):
            return False
        if wide is not out:
            out.copy_(wide)
        return True

    @staticmethod
    def _widens_at_once(tensor: torch.Tensor) -> bool:
        """fp32 (nothing to widen), or 16-bit of at most :data:`WIDEN_ELEMENTS`."""
        return tensor.dtype == torch.float32 or tensor.numel() <= WIDEN_ELEMENTS

    def _encode_rows(self, fast, blocks: torch.Tensor, scales: torch.Tensor, codes: torch.Tensor):
        """``fast``: the native encoder of :meth:`_native` for these rows, or None."""
        rows = blocks.shape[0]
        noise = self.noise(rows, blocks.device)
        if fast and self._encode_native(fast, blocks, noise, scales, codes):
            return
        self.encode_kernel(blocks, noise, scales, codes, fused=self.impl != "reference")

    def _encode_native(self, fast, blocks, noise, scales, codes) -> bool:
        """Run the C encoder on fp32 rows; 16-bit input is widened a slice of rows at a time."""
        if blocks.dtype == torch.float32:
            return fast(blocks, noise, blocks.shape[0], self.block, self.qmax, scales, codes)
        slices = self._widening_slices(blocks.shape[0])
        wide = blocks.new_empty(slices[0].stop, self.block, dtype=torch.float32)  # for every slice
        for rows in slices:
            part = wide[: rows.stop - rows.start].copy_(blocks[rows])
            part_noise = None if noise is None else noise[rows]
            if not fast(
                part, part_noise, len(part), self.block, self.qmax, scales[rows], codes[rows]
            ):
                return False
        return True

    def _decode_rows(self, fast, absmax: torch.Tensor, codes: torch.Tensor, out: torch.Tensor):
        """``fast``: the native decoder of :meth:`_native` for ``out``, or None."""
        if fast and self._decode_native(fast, absmax, codes, out):
            return
        self.decode_kernel(absmax, codes, out, fused=self.impl != "reference")

    def _decode_native(self, fast, absmax, codes, out) -> bool:
        """Run the C decoder into fp32; 16-bit output is rounded from it a slice at a time."""
        if out.dtype == torch.float32:
            return fast(absmax, codes, codes.shape[0], self.block, self.qmax, out, streams(out))
        slices = self._widening_slices(codes.shape[0])
        wide = out.new_empty(slices[0].stop * self.block, dtype=torch.float32)
        for rows in slices:
            count = rows.stop - rows.start
            part = wide[: count * self.block]
            if not fast(absmax[rows], codes[rows], count, self.block, self.qmax, part, 0):
                return False
            out[rows.start * self.block : rows.stop * self.block].copy_(part)
        return True

    def _widening_slices(self, rows: int) -> list[slice]:
        """Slices of ``rows`` block rows, each of at most WIDEN_ELEMENTS elements."""
        step = max(1, WIDEN_ELEMENTS // self.block)
        return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


@dataclasses.dataclass(frozen=True)
class IntegerBlockCodec(BlockScaledCodec):
    """Block absmax quantization to signed integers in [-qmax, qmax].

    Stochastic rounding draws its noise from generators that belong to this instance
    (one per device and process rank, see :mod:`commpress.codecs.rounding_noise`): each
    encode continues the stream, so successive calls and different ranks round
    independently, and ``get_codec`` returns one shared instance per spec, so the stream
    persists across collectives that name the same spec. A new instance (the class called
    directly, or ``dataclasses.replace(codec)``) restarts the stream: the same seed, rank
    and sequence of encodes reproduce the same payloads. :meth:`rounding_state` and
    :meth:`load_rounding_state` carry a rank's streams across a checkpoint.
    """

    #: Unbiased stochastic rounding instead of round-to-nearest.
    stochastic: bool = False
    #: Seed of the stochastic-rounding noise, mixed with the codec's kind and block, the
    #: process rank and the device.
    seed: int = 0
    _generators: rounding_noise.Generators = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.stochastic, bool):
            raise TypeError(f"stochastic must be a bool, got {self.stochastic!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {self.seed!r}")

    @property
    def grid_error(self) -> float:
        return 1.0 if self.stochastic else 0.5

    @property
    def idempotent(self) -> bool:
        # A decoded value sits a few fp32 ulps off its grid point: round-to-nearest finds
        # the point again, stochastic rounding may leave it by one step.
        return not self.stochastic

    @property
    def draws_noise(self) -> bool:
        return self.stochastic

    def noise(self, rows: int, device: torch.device) -> torch.Tensor | None:
        if not self.stochastic:
            return None
        stream = f"{self.name}:block={self.block}"  # every impl draws the same noise
        return rounding_noise.uniform(
            self._generators, self.seed, stream, (rows, self.block), device
        )

    def rounding_state(self) -> dict:
        """This process rank's stochastic-rounding streams, where they have got to: plain
        tensors and ints under the rank's key, for ``torch.save`` (one file per rank) or
        ``torch.distributed.checkpoint`` (see :meth:`load_rounding_state`)."""
        return rounding_noise.snapshot(self._generators, str(self), self.seed)

    def load_rounding_state(self, state: dict) -> None:
        """Continue this rank's streams from ``state``, a :meth:`rounding_state` this rank
        saved with an equal codec in a world of the same size, so that a resumed run draws
        the noise the uninterrupted run would have. Another rank's, world's, codec's or
        seed's state, or streams that cannot be loaded here, are a ``ValueError``; what is
        not a dict, a ``TypeError``."""
        rounding_noise.restore(self._generators, str(self), self.seed, state)
