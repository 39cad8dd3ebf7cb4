"""Reduce-scatter with compression, and its baselines.

* ``native``: ``torch.distributed.reduce_scatter_tensor`` on the raw tensor.
* ``ring`` (IPDPS'23): n - 1 ring steps; each hop decodes the partial sum it
  receives, adds its own contribution in fp32, re-encodes and forwards. Each chunk
  is cut into pieces of ``chunk_bytes`` (of fp32): while piece p is on the wire,
  piece p - 1 is decoded, accumulated and re-encoded.
* ``ring-hop``: the point-to-point compression baseline of MPI libraries: the same
  ring with whole chunks and no overlap (encode, send, wait, decode, add).
* ``alltoall`` (``backend`` is the same): each rank encodes each destination's slice
  once; one all-to-all (on gloo, CPU tensors, large payloads: point to point); each
  destination decodes and sums in fp32. One rounding per contribution instead of n - 1
  re-quantizations of a partial sum.

What a ring hop sends (:func:`~commpress.schedules.partial_sum_dtype`): a lossy codec
encodes the fp32 partial sum (its payload size does not depend on the dtype, so it never
exceeds the input's native size). A lossless codec (``none``) sends the partial sum in the
input's dtype, so bf16/fp16 input costs 2 bytes per element, as native does: each hop
still adds in fp32, then rounds the partial sum to bf16/fp16 for the wire, like NCCL's
bf16 ring. A bf16 result can therefore differ from an fp32-accumulated one by up to n - 1
roundings of partial sums (each at most half an ulp of bf16, 2**-8 relative); fp32 input
is summed and sent in fp32, unchanged.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.codecs import Codec, get_codec
from commpress.collectives import auto
from commpress.collectives.checks import (
    check_algorithm,
    check_chunk_bytes,
    check_device,
    check_flag,
    check_moved,
    check_op,
    check_pair,
    check_reduction_dtype,
    check_residual,
    check_residual_tensor,
    check_timeout,
    outside_group,
)
from commpress.collectives.executor import execute
from commpress.collectives.failures import named_failures
from commpress.collectives.fingerprint import Fingerprint
from commpress.collectives.payloads import reduction
from commpress.collectives.work import launch, queued_on, run_native, staged, write_into
from commpress.schedules import DEFAULT_CHUNK_BYTES, PIPELINED_REDUCTIONS, algorithms, plan
from commpress.transport import backends, collective

REDUCE_SCATTER_ALGORITHMS = algorithms("reduce_scatter")


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
    ``algorithm`` (either may be ``"auto"``: :mod:`commpress.sim.tuner`), ``chunk_bytes``
    (pipeline piece size of ``ring`` and ``alltoall``, bytes of fp32) and ``timeout``
    (a dead or stalled peer raises on every other rank; default: the group's).

    ``residual`` (``alltoall`` or ``backend``, the same all-to-all; fp32, ``inp``'s size):
    error feedback. It is added to ``inp`` before encoding and then holds what the encoding
    lost, so that ``inp + residual_before == sent + residual_after`` for this rank's
    contributions.
    Where that is not finite (a NaN or an infinity in ``inp``, which reaches ``out``), the
    residual restarts from zero, so that one bad step does not poison the later ones.
    """
    if outside_group(group, "reduce_scatter_tensor"):
        return None
    group = backends.or_world(group)  # the default group now, not when the call runs
    check_timeout(timeout)
    check_flag(async_op, "async_op")
    world_size = dist.get_world_size(group)
    op = check_op(op, algorithm)
    check_pair(out, inp, world_size=world_size, gather=False)
    check_chunk_bytes(chunk_bytes)
    feedback = residual is not None
    if feedback:
        check_residual_tensor(residual, inp)
    if auto.requested(codec, algorithm):  # its choice is agreed on over the group: first
        check_moved(inp, group)
        algorithm, codec = auto.resolve(
            "reduce_scatter", inp, group, codec, algorithm, feedback, chunk_bytes, op, timeout
        )
    check_algorithm(algorithm, REDUCE_SCATTER_ALGORITHMS, True, "reduce_scatter_tensor")
    check_residual(residual, inp, algorithm)
    check_device(algorithm, "reduce_scatter", inp, group)
    if algorithm == "native":
        contributions, (reduced, copy_back) = inp.contiguous(), staged(out)
        start = lambda: collective.reduce_scatter(reduced, contributions, op, group)  # noqa: E731
        tensors = (out, inp, reduced, contributions)
        return run_native(
            "reduce_scatter_tensor", start, group, async_op, timeout, tensors, copy_back
        )
    codec = get_codec(codec)
    check_reduction_dtype(inp.dtype, "inp.dtype")  # first: it names the way out
    codec.check_dtype(inp.dtype, "inp.dtype")
    pieces = chunk_bytes if algorithm in PIPELINED_REDUCTIONS else 0
    fingerprint = Fingerprint.of("reduce_scatter", inp, codec, algorithm, op, pieces)
    inp = inp.contiguous()

    def run() -> None:
        with named_failures("reduce_scatter_tensor", codec, algorithm, group, timeout):
            total = reduce(
                inp, group, codec, algorithm, chunk_bytes, timeout, fingerprint, residual
            )
        if op == dist.ReduceOp.AVG:
            total /= world_size
        write_into(out, total.view(out.shape))

    tensors = (out, inp) if residual is None else (out, inp, residual)
    return queued_on(group, launch(run, async_op, tensors))


def reduce(
    inp, group, codec: Codec, algorithm: str, chunk_bytes: int, timeout, fingerprint, residual=None
) -> torch.Tensor:
    """This rank's reduced chunk in fp32, on the calling thread (arguments checked), after
    every rank has agreed on ``fingerprint``."""
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    (schedule,) = plan(
        "reduce_scatter", algorithm, rank, world_size, inp.numel(), inp.dtype, codec, chunk_bytes
    )
    contributions = inp.view(world_size, -1)
    feedback = None if residual is None else residual.view(world_size, -1)
    payloads = reduction(contributions, codec, schedule, feedback)
    execute(schedule, payloads, group, timeout, fingerprint)
    return payloads.result
