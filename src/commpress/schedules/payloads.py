"""What travels: the dtype a reduction's partial sums are encoded in, and how a chunk is cut
into pipeline pieces. The executor and the byte counts both read them from here."""

from __future__ import annotations

import torch

#: Dtypes a compressed reduction may sum: it accumulates in fp32, which holds these exactly
#: (any other is left to torch's own collective).
REDUCTION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: Piece size of the pipelined ring reduce-scatter, in bytes of fp32 (MVAPICH's choice for
#: its compressed reduce-scatter).
DEFAULT_CHUNK_BYTES = 2 << 20
#: The smallest ``chunk_bytes`` a collective takes.
MIN_CHUNK_BYTES = 4


def partial_sum_dtype(codec, dtype: torch.dtype) -> torch.dtype:
    """The dtype a ring's partial sums (and ``all_reduce``'s reduced chunks) are encoded in.

    fp32, except with a lossless codec on 16-bit floats: those send the input's dtype, so
    that ``none`` never sends more bytes than native. A lossy codec's payload size does
    not depend on the dtype, so encoding the fp32 sum costs nothing extra.
    """
    if codec.lossless and dtype in (torch.bfloat16, torch.float16):
        return dtype
    return torch.float32


def pieces(numel: int, piece_numel: int) -> list[tuple[int, int]]:
    """``(offset, numel)`` of each piece of a chunk of ``numel`` (one empty piece for 0)."""
    if numel == 0:
        return [(0, 0)]
    return [(start, min(piece_numel, numel - start)) for start in range(0, numel, piece_numel)]


def piece_count(numel: int, piece_numel: int) -> int:
    """``len(pieces(numel, piece_numel))``, without making them."""
    return max(1, -(-numel // piece_numel))


def piece_numel(chunk_bytes: int) -> int:
    """Elements per pipeline piece: ``chunk_bytes`` of fp32."""
    return max(1, chunk_bytes // 4)


def chunk_numel(numel: int, world_size: int) -> int:
    """Elements per rank's chunk of a reduction (all-reduce pads the tensor to n chunks)."""
    return -(-numel // world_size)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
