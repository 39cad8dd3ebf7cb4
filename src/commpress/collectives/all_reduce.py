"""All-reduce: a compressed reduce-scatter, then an all-gather of the reduced chunks.

Every rank ends with bitwise-identical results (the all-gather forwards one encoding of
each reduced chunk). The algorithm picks both halves (:mod:`commpress.schedules`):
``ring-hop`` also re-encodes at every hop of the all-gather; ``alltoall`` gathers by ring.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.codecs import Codec, get_codec
from commpress.collectives.all_gather import gather
from commpress.collectives.checks import (
    check_algorithm,
    check_codec_has_no_tuner,
    check_dense,
    check_device,
    check_flag,
    check_no_shared_elements,
    check_op,
    check_reduction_dtype,
    check_same_result_on_every_rank,
    check_timeout,
    outside_group,
)
from commpress.collectives.executor import call_deadline
from commpress.collectives.failures import named_failures
from commpress.collectives.fingerprint import Fingerprint
from commpress.collectives.reduce_scatter import reduce
from commpress.collectives.work import launch, queued_on, run_native, staged, write_into
from commpress.collectives.workspace import workspace
from commpress.schedules import DEFAULT_CHUNK_BYTES, algorithms, get_algorithm, partial_sum_dtype
from commpress.schedules.payloads import chunk_numel
from commpress.transport import backends, collective

ALL_REDUCE_ALGORITHMS = algorithms("all_reduce")


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
    """Sum (or average) ``tensor`` over ranks, in place; same convention as
    :func:`torch.distributed.all_reduce`, plus ``codec``, ``algorithm`` and ``timeout``."""
    if outside_group(group, "all_reduce"):
        return None
    group = backends.or_world(group)  # the default group now, not when the call runs
    check_timeout(timeout)
    check_flag(async_op, "async_op")
    check_algorithm(algorithm, ALL_REDUCE_ALGORITHMS, collective="all_reduce")
    op = check_op(op, algorithm)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    check_dense(tensor, "tensor")
    check_no_shared_elements(tensor, "tensor")
    check_device(algorithm, "all_reduce", tensor, group, "tensor")
    if algorithm == "native":
        reduced, copy_back = staged(tensor, read=True)
        start = lambda: collective.all_reduce(reduced, op, group)  # noqa: E731
        tensors = (tensor, reduced)
        return run_native("all_reduce", start, group, async_op, timeout, tensors, copy_back)
    check_codec_has_no_tuner(codec)
    codec = get_codec(codec)
    check_reduction_dtype(tensor.dtype, "tensor.dtype")  # first: it names the way out
    codec.check_dtype(tensor.dtype, "tensor.dtype")
    gather_algorithm = get_algorithm(algorithm, "all_reduce").all_reduce_gather
    check_same_result_on_every_rank(codec, gather_algorithm)
    world_size, numel = dist.get_world_size(group), tensor.numel()
    fingerprint = Fingerprint.of("all_reduce", tensor, codec, algorithm, op)

    def run() -> None:
        with named_failures("all_reduce", codec, algorithm, group, timeout):
            reduce_then_gather()

    def reduce_then_gather() -> None:
        deadline = call_deadline(timeout, group, tensor.device)  # both halves': the call's
        chunk = chunk_numel(numel, world_size)
        padded = workspace.take(
            "all_reduce.padded", world_size * chunk, tensor.dtype, tensor.device
        )
        padded[:numel] = tensor.reshape(-1)
        padded[numel:] = 0
        total = reduce(padded, group, codec, algorithm, DEFAULT_CHUNK_BYTES, deadline, fingerprint)
        if op == dist.ReduceOp.AVG:
            total /= world_size
        sent_dtype = partial_sum_dtype(codec, tensor.dtype)  # bf16 with `none`: 2 bytes each
        if total.dtype != sent_dtype:
            narrowed = workspace.take("all_reduce.narrowed", chunk, sent_dtype, total.device)
            total = narrowed.copy_(total)
        gathered = workspace.take(
            "all_reduce.gathered", world_size * chunk, total.dtype, total.device
        )
        gather(gathered, total, group, codec, gather_algorithm, deadline)
        write_into(tensor, gathered[:numel].view(tensor.shape))

    return queued_on(group, launch(run, async_op, (tensor,)))
