"""Bytes each rank sends per call, by op and algorithm: the one formula behind the bench's
``wire(B)`` column and the FSDP and DDP counters.

One function per algorithm family, each reading how that algorithm sends (piece sizes
and the dtype of partial sums come from the collectives themselves). ``numel`` is the
per-rank input of the op (the shard for all-gather, the whole tensor otherwise); the
chunk of a reduction is ``ceil(numel / n)`` (all-reduce pads to n equal chunks).
"""

from __future__ import annotations

import torch

from commpress.codecs import get_codec
from commpress.collectives.reduce_scatter import partial_sum_dtype, ring_piece_numel


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def chunk_numel(numel: int, world_size: int) -> int:
    """Elements per rank's chunk of a reduction (all-reduce pads the tensor to n chunks)."""
    return -(-numel // world_size)


def native(op: str, numel: int, world_size: int, dtype: torch.dtype) -> int:
    """What a bandwidth-optimal uncompressed ring sends: nccl-tests' busbw bytes.

    ``size x busbw factor``: (n - 1) shards for all-gather and reduce-scatter, twice that
    for all-reduce. gloo's own reduce-scatter is known to send more (see the README).
    """
    shard = numel if op == "all_gather" else chunk_numel(numel, world_size)
    messages = 2 * (world_size - 1) if op == "all_reduce" else world_size - 1
    return messages * shard * itemsize(dtype)


def ring_all_gather(codec, shard: int, world_size: int, dtype: torch.dtype) -> int:
    """Each shard is encoded once (``ring``) or per hop at the same size (``ring-hop``) and
    crosses n - 1 links: every rank sends n - 1 payloads."""
    return (world_size - 1) * get_codec(codec).wire_bytes(shard, dtype)


def reduce_scatter(algorithm: str, codec, chunk: int, world_size: int, dtype: torch.dtype) -> int:
    """``ring``/``ring-hop``: n - 1 hops, each sending one chunk's partial sum, piece by
    piece, in :func:`partial_sum_dtype`. ``alltoall``: one payload of the input dtype to
    each of the n - 1 other ranks (the own slot never leaves the host)."""
    codec = get_codec(codec)
    if chunk == 0:
        return 0
    if algorithm == "alltoall":
        return (world_size - 1) * codec.wire_bytes(chunk, dtype)
    sent = partial_sum_dtype(codec, dtype)
    piece = ring_piece_numel(algorithm, chunk)
    whole, rest = divmod(chunk, piece)
    per_hop = whole * codec.wire_bytes(piece, sent) + (codec.wire_bytes(rest, sent) if rest else 0)
    return (world_size - 1) * per_hop


def all_reduce(algorithm: str, codec, chunk: int, world_size: int, dtype: torch.dtype) -> int:
    """Reduce-scatter, then a ring all-gather of each reduced chunk in ``partial_sum_dtype``."""
    gathered = partial_sum_dtype(get_codec(codec), dtype)
    return reduce_scatter(algorithm, codec, chunk, world_size, dtype) + ring_all_gather(
        codec, chunk, world_size, gathered
    )


def wire_bytes(
    op: str, algorithm: str, codec, numel: int, world_size: int, dtype: torch.dtype
) -> int:
    """Bytes each rank sends per call (the largest, where chunks are uneven)."""
    if algorithm == "native":
        return native(op, numel, world_size, dtype)
    if op == "all_gather":
        return ring_all_gather(codec, numel, world_size, dtype)
    chunk = chunk_numel(numel, world_size)
    if op == "reduce_scatter":
        return reduce_scatter(algorithm, codec, chunk, world_size, dtype)
    return all_reduce(algorithm, codec, chunk, world_size, dtype)
