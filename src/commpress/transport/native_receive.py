"""The multicast's DATA datagrams taken in C (``receive.c``): checked, copied into their
root's buffer and marked received, a coalesced read at a time (measured:
``benchmarks/multicast_2026-11-26/``). Everything else stays with the Python protocol
(:mod:`commpress.transport.reliable_broadcast`), which the C side stops for.

Needs a C compiler (as the codecs' native kernels) and zlib's ``crc32`` (the library
Python's :mod:`zlib` wraps): without either, :func:`taker` returns None and every datagram
takes the Python path.
"""

from __future__ import annotations

import array
import ctypes
import ctypes.util
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from commpress.codecs import native

SOURCE = Path(__file__).with_name("receive.c")


class _State(ctypes.Structure):
    """``take_state`` of receive.c: what stays the same for one operation."""

    _fields_ = [
        ("channel", ctypes.c_int64),
        ("operation", ctypes.c_int64),
        ("rank", ctypes.c_int64),
        ("world_size", ctypes.c_int64),
        ("chunk_bytes", ctypes.c_int64),
        ("buffers", ctypes.POINTER(ctypes.c_void_p)),
        ("buffer_bytes", ctypes.POINTER(ctypes.c_int64)),
        ("counts", ctypes.POINTER(ctypes.c_int64)),
        ("bitmaps", ctypes.POINTER(ctypes.c_void_p)),
        ("missing", ctypes.POINTER(ctypes.c_int64)),
        ("crc32", ctypes.c_void_p),
    ]


@functools.cache
def _library() -> tuple[ctypes._CFuncPtr, int] | None:
    """``(commpress_take_data, address of zlib's crc32)``, or None where either is missing."""
    library = native.load(SOURCE, instead="the Python receive path")
    crc32 = _zlib_crc32()
    if library is None or crc32 is None:
        return None
    function = library.commpress_take_data
    function.restype = ctypes.c_int64
    function.argtypes = [
        ctypes.POINTER(_State),
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    return function, crc32


def available() -> bool:
    """Whether the C path can run here (built on the first call, then cached)."""
    return _library() is not None


def _zlib_crc32() -> int | None:
    for name in ("libz.so.1", ctypes.util.find_library("z")):
        if name is None:
            continue
        try:
            return ctypes.cast(ctypes.CDLL(name).crc32, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


def _address(buffer) -> int | None:
    """Where a writable, contiguous buffer's bytes start; None for any other (or an empty
    one)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    except (TypeError, ValueError, BufferError):
        return None


def _pinned(buffer) -> ctypes.Array | None:
    """``buffer``'s bytes as a ctypes array that holds an export of it (so that a bytearray
    cannot be resized under C), or None where it is not writable and contiguous."""
    if not len(buffer):
        return None
    try:
        return (ctypes.c_char * memoryview(buffer).nbytes).from_buffer(buffer)
    except (TypeError, ValueError, BufferError):
        return None


def _address_of(pinned: ctypes.Array | None) -> int | None:
    return None if pinned is None else ctypes.addressof(pinned)


class Taker:
    """One operation's :func:`taker`: ``taker(batch, segment)`` takes DATA datagrams of
    ``segment`` bytes (the last may be shorter) from the start of ``batch`` and returns how
    many it took, and the roots each of them came from (``touched``, cleared by the caller).
    The buffers come pinned (:func:`_pinned`, None where empty): C writes to their
    addresses."""

    def __init__(self, function, crc32: int, channel: int, operation: int, rank: int,
                 chunk_bytes: int, buffers: Sequence[ctypes.Array | None],
                 buffer_bytes: Sequence[int], counts: Sequence[int],
                 bitmaps: Sequence[ctypes.Array | None], missing: array.array):  # fmt: skip
        world_size = len(buffers)
        self._function = function
        self.touched = bytearray(world_size)
        touched, missing_counts = _pinned(self.touched), _pinned(missing)
        self._pins = [*buffers, *bitmaps, touched, missing_counts]  # C holds their addresses
        pointers = ctypes.c_void_p * world_size
        self._buffers = pointers(*map(_address_of, buffers))
        self._bitmaps = pointers(*map(_address_of, bitmaps))
        self._buffer_bytes = (ctypes.c_int64 * world_size)(*buffer_bytes)
        self._counts = (ctypes.c_int64 * world_size)(*counts)
        self._state = _State(
            channel, operation, rank, world_size, chunk_bytes,
            self._buffers, self._buffer_bytes, self._counts, self._bitmaps,
            ctypes.cast(missing_counts, ctypes.POINTER(ctypes.c_int64)), crc32,
        )  # fmt: skip
        self._touched_at = ctypes.addressof(touched)

    def __call__(self, batch, segment: int) -> int:
        start = _address(batch)
        if start is None:
            return 0
        return self._function(
            ctypes.byref(self._state), start, len(batch), segment, self._touched_at
        )


def taker(channel: int, operation: int, rank: int, chunk_bytes: int, buffers: Sequence,
          counts: Sequence[int], bitmaps: Sequence[bytearray],
          missing: array.array) -> Callable[[memoryview, int], int] | None:  # fmt: skip
    """A :class:`Taker` for one operation whose payloads go into ``buffers`` (one writable
    buffer per rank, this rank's own empty), with ``counts`` chunks each, received as
    ``bitmaps`` say, ``missing`` still to come; None where the C side is unavailable."""
    found = _library()
    if found is None:
        return None
    pinned_buffers, pinned_bitmaps = [*map(_pinned, buffers)], [*map(_pinned, bitmaps)]
    pins = zip((*buffers, *bitmaps), (*pinned_buffers, *pinned_bitmaps), strict=True)
    if any(len(b) and pin is None for b, pin in pins):
        return None  # C writes through raw addresses: writable, contiguous buffers only
    function, crc32 = found
    return Taker(
        function, crc32, channel, operation, rank, chunk_bytes, pinned_buffers,
        [len(b) for b in buffers], counts, pinned_bitmaps, missing,
    )  # fmt: skip
