"""The codec contract and the checks every codec shares.

A codec turns a tensor into a fixed-size 1-D ``torch.uint8`` payload and back.
The payload size depends only on ``(numel, dtype)`` and is known before encoding
(``wire_bytes``), so a receiver can allocate its buffer without a size exchange:
the property that lets a ring forward compressed bytes unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, Protocol, runtime_checkable

import torch

from commpress.units import counted

#: Dtypes a lossy codec accepts as input and can decode to.
FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
#: Payload sizes a codec keeps (:meth:`CodecBase._kept_wire_bytes`): a model's shapes.
KEPT_WIRE_SIZES = 1024


@runtime_checkable
class Codec(Protocol):
    """What every codec offers. Implementations are immutable value objects."""

    name: ClassVar[str]
    #: True when ``decode(encode(x))`` reproduces ``x`` bit for bit.
    lossless: ClassVar[bool]
    #: True when a decoded tensor encodes to itself again (``y = decode(encode(x))`` gives
    #: ``decode(encode(y)) == y`` bit for bit), so re-encoding at every hop (``ring-hop``)
    #: leaves every rank with the same values.
    idempotent: bool

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        """Exact payload size for a tensor of ``numel`` elements of ``dtype``."""
        ...

    def encode(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (any shape) -> 1-D uint8 payload of ``wire_bytes(x.numel(), x.dtype)``.

        ``out``: a preallocated payload buffer to fill (a send buffer, say).
        """
        ...

    def decode(
        self,
        payload: torch.Tensor,
        numel: int,
        dtype: torch.dtype,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Payload -> 1-D tensor of ``numel`` elements of ``dtype`` on the payload's device."""
        ...

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        """Per-element bound on ``|x - decode(encode(x), dtype=float32)|`` for finite ``x``."""
        ...


@dataclasses.dataclass(frozen=True)
class CodecBase:
    """Shared plumbing: argument checks and the ``out=`` convention of ``decode``."""

    name: ClassVar[str] = ""
    lossless: ClassVar[bool] = False
    idempotent: ClassVar[bool] = True
    #: Whether encodes draw noise (stochastic rounding): the order of a call's encodes then
    #: decides its bits.
    draws_noise: ClassVar[bool] = False
    #: Input dtypes this codec accepts; ``None`` means any dtype.
    input_dtypes: ClassVar[tuple[torch.dtype, ...] | None] = FLOAT_DTYPES

    #: What an instance computes once and keeps (:func:`functools.cached_property`): never
    #: pickled nor shared by copies (a copy's dict would be the original's).
    _KEPT = ("_spec", "_wire_sizes")

    def __str__(self) -> str:
        """The canonical spec string: the name and every option that differs from its default."""
        return self._spec

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in CodecBase._KEPT}

    @functools.cached_property
    def _spec(self) -> str:
        """:meth:`__str__`, made once per codec (immutable): every collective names its codec
        (its argument check, its failures' messages)."""
        changed = [
            f"{f.name}={_format_option(getattr(self, f.name))}"
            for f in dataclasses.fields(self)
            if f.init and getattr(self, f.name) != f.default
        ]
        return self.name + (":" + ",".join(changed) if changed else "")

    def check_dtype(self, dtype: torch.dtype, argument: str) -> None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{argument} must be a torch.dtype, got {dtype!r}")
        if self.input_dtypes is not None and dtype not in self.input_dtypes:
            known = ", ".join(str(d).removeprefix("torch.") for d in self.input_dtypes)
            raise TypeError(
                f"codec {self.name!r} cannot take {argument}={dtype}; it handles {known}"
                " (use codec 'none' for other dtypes)"
            )

    def check_input(self, x: torch.Tensor) -> torch.Tensor:
        """Validate ``x`` and return it as a contiguous 1-D view (or copy), outside autograd."""
        check_tensor(x, "x")
        self.check_dtype(x.dtype, "x.dtype")
        lazy = x.is_conj() or x.is_neg()  # x.conj() and its .imag: memory that is not x
        if x.dim() == 1 and x.stride(0) == 1 and not x.requires_grad and not lazy:
            return x  # as it is: each view costs microseconds, on every call
        flat = x.detach().reshape(-1).contiguous()  # a strided 1-D view stays strided
        if lazy:
            flat = flat.resolve_conj().resolve_neg()
        if flat.stride(0) != 1:  # one element (or none) is contiguous whatever its stride,
            flat = flat.as_strided((flat.numel(),), (1,))  # which views as bytes refuse
        return flat

    def check_payload(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> None:
        check_tensor(payload, "payload")
        if payload.dtype != torch.uint8 or payload.dim() != 1:
            raise ValueError(
                f"payload must be a 1-D torch.uint8 tensor, got {payload.dtype} "
                f"with shape {tuple(payload.shape)}"
            )
        if not payload.is_contiguous():
            raise ValueError("payload must be contiguous (a strided view: pass .contiguous())")
        check_numel(numel)
        self.check_dtype(dtype, "dtype")
        expected = self._kept_wire_bytes(numel, dtype)
        if payload.numel() != expected:
            raise ValueError(
                f"payload has {counted(payload.numel(), 'byte')} but codec {str(self)!r} encodes "
                f"numel={numel} of {dtype} into exactly {expected} bytes"
            )

    def payload_buffer(self, out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """The destination of an encode: ``out`` (checked) or a new uint8 tensor."""
        size = self._kept_wire_bytes(x.numel(), x.dtype)
        if out is None:
            return torch.empty(size, dtype=torch.uint8, device=x.device)
        check_tensor(out, "out")
        if out.dtype != torch.uint8 or out.dim() != 1 or out.numel() != size:
            raise ValueError(
                f"out must be a 1-D torch.uint8 tensor of {size} bytes, got {out.dtype} "
                f"with shape {tuple(out.shape)}"
            )
        if out.device != x.device or not out.is_contiguous():
            raise ValueError(f"out must be contiguous and on {x.device}, like x")
        return out

    def _kept_wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        """:meth:`wire_bytes`, kept per ``(numel, dtype)`` once it has answered (the checks
        of every encode and decode ask it; it depends on nothing else)."""
        sizes = self._wire_sizes
        size = sizes.get((numel, dtype))
        if size is None:
            size = self.wire_bytes(numel, dtype)
            if len(sizes) >= KEPT_WIRE_SIZES:
                sizes.clear()
            sizes[numel, dtype] = size
        return size

    @functools.cached_property
    def _wire_sizes(self) -> dict[tuple[int, torch.dtype], int]:
        return {}

    def output(
        self, out: torch.Tensor | None, numel: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """The 1-D destination of a decode: ``out`` (checked) or a new tensor."""
        if out is None:
            return torch.empty(numel, dtype=dtype, device=device)
        check_tensor(out, "out")
        if out.dtype != dtype or out.numel() != numel or out.device != device:
            raise ValueError(
                f"out must hold {counted(numel, 'element')} of {dtype} on {device}, got "
                f"{out.numel()} of {out.dtype} on {out.device}"
            )
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")
        return out if out.dim() == 1 else out.view(-1)


def check_tensor(value: object, argument: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor, got {type(value).__name__}")


def check_numel(numel: int) -> None:
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be a non-negative int, got {numel!r}")


def is_aligned(payload_bytes: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a uint8 slice can be viewed as ``dtype`` (its offset is a multiple of the size).

    Payloads are often slices of a larger buffer, whose offsets need not be aligned.
    """
    itemsize = dtype.itemsize  # torch's view needs the offset; a kernel, the address
    return (
        payload_bytes.storage_offset() % itemsize == 0 and payload_bytes.data_ptr() % itemsize == 0
    )


def view_as_dtype(payload_bytes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret a uint8 slice as ``dtype``, copying only when it is misaligned."""
    if not is_aligned(payload_bytes, dtype):
        payload_bytes = payload_bytes.clone()
    return payload_bytes.view(dtype)


def _format_option(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        short = f"{value:g}"  # 6 digits: the spec must parse back to this very value
        return short if float(short) == value else repr(value)
    return str(value)
