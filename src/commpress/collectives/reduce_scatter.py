"""Reduce-scatter with compression, and all-reduce built from it.

* ``native``: ``torch.distributed.reduce_scatter_tensor`` on the raw tensor.
* ``ring`` (IPDPS'23): n - 1 ring steps; each hop decodes the partial sum it
  receives, adds its own contribution in fp32, re-encodes and forwards. Each chunk
  is cut into pieces of ``chunk_bytes`` (of fp32): while piece p is on the wire,
  piece p - 1 is decoded, accumulated and re-encoded.
* ``ring-hop``: the point-to-point compression baseline of MPI libraries: the same
  ring with whole chunks and no overlap (encode, send, wait, decode, add).
* ``alltoall``: each rank encodes each destination's slice once; one all-to-all;
  each destination decodes and sums in fp32. One rounding per contribution
  instead of n - 1 re-quantizations of a partial sum.

What a ring hop sends (:func:`partial_sum_dtype`): a lossy codec encodes the fp32
partial sum (its payload size does not depend on the dtype, so it never exceeds the
input's native size). A lossless codec (``none``) sends the partial sum in the input's
dtype, so bf16/fp16 input costs 2 bytes per element, as native does: each hop still adds
in fp32, then rounds the partial sum to bf16/fp16 for the wire, like NCCL's bf16 ring.
A bf16 result can therefore differ from an fp32-accumulated one by up to n - 1
roundings of partial sums (each at most half an ulp of bf16, 2**-8 relative); fp32
input is summed and sent in fp32, unchanged. ``all_reduce`` all-gathers its reduced
chunks in the same dtype.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.algorithms.ring import neighbours, reduce_scatter_steps
from commpress.codecs import Codec, get_codec
from commpress.collectives.all_gather import ring_all_gather
from commpress.collectives.checks import (
    check_algorithm,
    check_op,
    check_pair,
    check_reduction_dtype,
    check_same_result_on_every_rank,
)
from commpress.collectives.fingerprint import Agreement, Fingerprint
from commpress.collectives.work import launch
from commpress.collectives.workspace import workspace
from commpress.transport.p2p import Exchange, wait

REDUCE_SCATTER_ALGORITHMS = ("native", "ring", "ring-hop", "alltoall")
#: Piece size of the pipelined ring (MVAPICH's choice for its compressed reduce-scatter).
DEFAULT_CHUNK_BYTES = 2 << 20


def reduce_scatter_tensor(
    out: torch.Tensor,
    inp: torch.Tensor,
    op=dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    *,
    codec: str | Codec = "int8",
    algorithm: str = "ring",
    async_op: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    timeout: timedelta | None = None,
    residual: torch.Tensor | None = None,
):
    """Sum (or average) ``inp`` over ranks; rank r keeps chunk r in ``out``.

    Same convention as :func:`torch.distributed.reduce_scatter_tensor`, plus ``codec``,
    ``algorithm``, ``chunk_bytes`` (pipeline piece size of ``ring``) and ``timeout``
    (a dead or stalled peer raises on every other rank; default: the group's).

    ``residual`` (``alltoall`` only; fp32, ``inp``'s size): error feedback. It is added
    to ``inp`` before encoding and then holds what the encoding lost, so that
    ``inp + residual_before == sent + residual_after`` for this rank's contributions.
    """
    world_size = dist.get_world_size(group)
    check_algorithm(algorithm, REDUCE_SCATTER_ALGORITHMS)
    check_op(op)
    check_pair(out, inp, world_size=world_size, gather=False)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 4:
        raise ValueError(f"chunk_bytes must be an int of at least 4, got {chunk_bytes!r}")
    _check_residual(residual, inp, algorithm)
    if algorithm == "native":
        work = dist.reduce_scatter_single(out, inp, op=op, group=group, async_op=True)
        return work if async_op else wait(work, timeout)
    codec = get_codec(codec)
    codec.check_dtype(inp.dtype, "inp.dtype")
    check_reduction_dtype(inp.dtype, "inp.dtype")
    pieces = chunk_bytes if algorithm == "ring" else 0
    fingerprint = Fingerprint.of("reduce_scatter", inp, codec, algorithm, op, pieces)

    def run() -> None:
        gate = Agreement(group, fingerprint, timeout, inp.device).check
        total = _reduce_scatter_fp32(
            inp, group, codec, algorithm, chunk_bytes, timeout, gate, residual
        )
        if op == dist.ReduceOp.AVG:
            total /= world_size
        out.view(-1).copy_(total)

    return launch(run, async_op, (out, inp) if residual is None else (out, inp, residual))


def all_reduce(
    tensor: torch.Tensor,
    op=dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    *,
    codec: str | Codec = "int8",
    algorithm: str = "ring",
    async_op: bool = False,
    timeout: timedelta | None = None,
):
    """Compressed reduce-scatter, then compressed ring all-gather of the reduced chunks.

    Every rank ends with bitwise-identical results (the all-gather forwards one
    encoding of each reduced chunk). ``algorithm`` picks the reduce-scatter;
    ``ring-hop`` also makes the all-gather re-encode at every hop.
    """
    check_algorithm(algorithm, REDUCE_SCATTER_ALGORITHMS)
    check_op(op)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous")
    if algorithm == "native":
        work = dist.all_reduce(tensor, op=op, group=group, async_op=True)
        return work if async_op else wait(work, timeout)
    codec = get_codec(codec)
    codec.check_dtype(tensor.dtype, "tensor.dtype")
    check_reduction_dtype(tensor.dtype, "tensor.dtype")
    check_same_result_on_every_rank(codec, algorithm)  # its all-gather half
    world_size, numel = dist.get_world_size(group), tensor.numel()
    fingerprint = Fingerprint.of("all_reduce", tensor, codec, algorithm, op)

    def run() -> None:
        gate = Agreement(group, fingerprint, timeout, tensor.device).check
        chunk = -(-numel // world_size)
        padded = workspace.take(
            "all_reduce.padded", world_size * chunk, tensor.dtype, tensor.device
        )
        padded[:numel] = tensor.view(-1)
        padded[numel:] = 0
        total = _reduce_scatter_fp32(
            padded, group, codec, algorithm, DEFAULT_CHUNK_BYTES, timeout, gate
        )
        if op == dist.ReduceOp.AVG:
            total /= world_size
        sent_dtype = partial_sum_dtype(codec, tensor.dtype)  # bf16 with `none`: 2 bytes each
        if total.dtype != sent_dtype:
            narrowed = workspace.take("all_reduce.narrowed", chunk, sent_dtype, total.device)
            total = narrowed.copy_(total)
        gathered = workspace.take(
            "all_reduce.gathered", world_size * chunk, total.dtype, total.device
        )
        hop = algorithm == "ring-hop"
        ring_all_gather(gathered, total, group, codec, hop, timeout)  # already on the thread
        tensor.view(-1).copy_(gathered[:numel])

    return launch(run, async_op, (tensor,))


def _check_residual(residual, inp: torch.Tensor, algorithm: str) -> None:
    if residual is None:
        return
    if algorithm != "alltoall":
        raise ValueError(
            f"residual (error feedback) needs algorithm='alltoall', got {algorithm!r}: "
            "only there is every rounding done on the rank that owns the data"
        )
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
    if (
        residual.dtype != torch.float32
        or residual.numel() != inp.numel()
        or residual.device != inp.device
        or not residual.is_contiguous()
    ):
        raise ValueError(
            f"residual must be a contiguous float32 tensor of inp's size ({inp.numel()}) on "
            f"{inp.device}, got {residual.dtype} of {residual.numel()} on {residual.device}"
        )


def _reduce_scatter_fp32(
    inp, group, codec: Codec, algorithm: str, chunk_bytes: int, timeout, gate, residual=None
):
    """The reduced chunk of this rank in fp32. ``gate`` runs after the first encodes and
    before the first send (the argument check, overlapping the encoding)."""
    world_size = dist.get_world_size(group)
    contributions = inp.view(world_size, -1)
    if algorithm == "alltoall":
        feedback = None if residual is None else residual.view(world_size, -1)
        return _alltoall(contributions, group, codec, timeout, gate, feedback)
    piece = ring_piece_numel(algorithm, contributions.shape[1], chunk_bytes)
    return _ring(contributions, group, codec, piece, algorithm == "ring", timeout, gate)


def partial_sum_dtype(codec: Codec, dtype: torch.dtype) -> torch.dtype:
    """The dtype a ring's partial sums (and ``all_reduce``'s reduced chunks) are encoded in.

    fp32, except with a lossless codec on 16-bit floats: those send the input's dtype, so
    that ``none`` never sends more bytes than native. A lossy codec's payload size does
    not depend on the dtype, so encoding the fp32 sum costs nothing extra.
    """
    if codec.lossless and dtype in (torch.bfloat16, torch.float16):
        return dtype
    return torch.float32


def ring_piece_numel(algorithm: str, numel: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Elements per piece of a chunk of ``numel``: each piece is encoded on its own."""
    return max(1, chunk_bytes // 4) if algorithm == "ring" else max(1, numel)


def _ring(contributions, group, codec: Codec, piece_numel: int, overlap: bool, timeout, gate):
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    numel = contributions.shape[1]
    if world_size == 1:
        gate()
        return contributions[rank].to(torch.float32, copy=True)
    pieces = [
        slice(start, min(start + piece_numel, numel)) for start in range(0, numel, piece_numel)
    ]
    sent_dtype = partial_sum_dtype(codec, contributions.dtype)
    wire = [codec.wire_bytes(p.stop - p.start, sent_dtype) for p in pieces]
    device = contributions.device
    outgoing = workspace.take_pieces("reduce_scatter.outgoing", wire, device)
    incoming = workspace.take_pieces("reduce_scatter.incoming", wire, device)
    forward = workspace.take_pieces("reduce_scatter.forward", wire, device)
    result = workspace.take("reduce_scatter.result", numel, torch.float32, device)
    scratch = workspace.take(
        "reduce_scatter.scratch", min(piece_numel, numel), torch.float32, device
    )
    narrow = None  # the partial sum rounded to the dtype it is sent in, when not fp32
    if sent_dtype != torch.float32:
        narrow = workspace.take(
            "reduce_scatter.narrow", min(piece_numel, numel), sent_dtype, device
        )
    steps = reduce_scatter_steps(rank, world_size)
    for p, part in enumerate(pieces):
        codec.encode(contributions[steps[0].send, part].to(sent_dtype), out=outgoing[p])
    gate()
    left, right = neighbours(rank, world_size)

    for index, step in enumerate(steps):
        last = index == len(steps) - 1

        def accumulate(p: int, step=step, last=last, forward=forward) -> None:
            own = contributions[step.recv, pieces[p]]
            partial = scratch[: own.numel()]
            rounded = None if narrow is None else narrow[: own.numel()]
            _add_own(
                codec,
                incoming[p],
                own,
                partial,
                result[pieces[p]] if last else None,
                forward[p],
                rounded,
            )

        for p in range(len(pieces)):
            exchange = Exchange(group, outgoing[p], right, incoming[p], left)
            if overlap and p > 0:  # runs while piece p is on the wire
                accumulate(p - 1)
            exchange.wait(timeout)
            if not overlap:
                accumulate(p)
        if overlap and pieces:
            accumulate(len(pieces) - 1)
        outgoing, forward = forward, outgoing
    return result


def _add_own(
    codec: Codec, received, own, partial, result_part, forward_payload, rounded=None
) -> None:
    """Decode a received partial sum into ``partial``, add the own contribution in fp32,
    then keep it (``result_part``) or re-encode it for the next hop.

    ``rounded``: a buffer of the dtype partial sums travel in when that is not fp32 (a
    lossless codec on 16-bit input): the payload is decoded through it, and the fp32 sum
    is rounded into it before encoding.
    """
    if rounded is None:
        codec.decode(received, own.numel(), torch.float32, out=partial)
    else:
        partial.copy_(codec.decode(received, own.numel(), rounded.dtype, out=rounded))
    partial += own
    if result_part is not None:
        result_part.copy_(partial)
    elif rounded is None:
        codec.encode(partial, out=forward_payload)
    else:
        codec.encode(rounded.copy_(partial), out=forward_payload)


def _alltoall(contributions, group, codec: Codec, timeout, gate, residual=None):
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if residual is not None:  # the encodes below update it: check the arguments first
        gate()
    numel, dtype = contributions.shape[1], contributions.dtype
    wire = codec.wire_bytes(numel, dtype)
    device = contributions.device
    send = workspace.take("alltoall.send", world_size * wire, torch.uint8, device)
    send = send.view(world_size, wire)
    send[rank] = 0  # never encoded, but sent: keep stale data off the wire
    for destination in range(world_size):
        if destination == rank:  # the own slice is added exactly, never encoded
            continue
        if residual is None or codec.lossless:  # a lossless codec leaves nothing to feed back
            codec.encode(contributions[destination], out=send[destination])
        else:
            corrected = contributions[destination].float() + residual[destination]
            codec.encode(corrected, out=send[destination])
            sent = _decode_fp32(codec, send[destination], numel, torch.float32)
            torch.sub(corrected, sent, out=residual[destination])
    received = workspace.take("alltoall.received", world_size * wire, torch.uint8, device)
    received = received.view(world_size, wire)
    gate()
    wait(
        dist.all_to_all_single(received.view(-1), send.view(-1), group=group, async_op=True),
        timeout,
    )
    total = contributions[rank].to(torch.float32, copy=True)  # never alias the input
    for source in range(world_size):
        if source != rank:
            total += _decode_fp32(codec, received[source], numel, dtype)
    return total


def _decode_fp32(codec: Codec, payload, numel: int, encoded_dtype: torch.dtype):
    """Lossy payloads decode straight to fp32 (no detour through a 16-bit dtype); a
    lossless payload holds ``encoded_dtype`` bytes, which widen to fp32 exactly."""
    if codec.lossless:
        return codec.decode(payload, numel, encoded_dtype).float()
    return codec.decode(payload, numel, torch.float32)
