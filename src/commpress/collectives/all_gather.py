"""All-gather with compression at the collective level (IPDPS'23), and its baselines.

* ``native``: ``torch.distributed.all_gather_into_tensor`` on the raw tensor.
* ``ring``: each rank encodes its shard once; payloads travel the ring unchanged; a
  received payload is decoded while the next one is in flight.
* ``ring-hop``: the same ring, but every hop decodes and re-encodes before sending, as
  MPI libraries that compress point-to-point messages do.
* ``backend``: each rank encodes its shard once; the backend's own all-gather (gloo's or
  NCCL's, in native code) moves the payloads; each is decoded once it has arrived.
* ``multicast``: each rank encodes its shard once and injects it once; the network
  replicates it (reliable UDP multicast, :mod:`commpress.transport.multicast`; CUDA
  payloads staged through host memory). Pays where a shared link is the bottleneck (racks
  behind a slow uplink).

In every one the owner keeps the *decoded* copy of its own shard, so all ranks end
bitwise identical. The schedules are in :mod:`commpress.schedules`.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.codecs import Codec, get_codec
from commpress.collectives import auto
from commpress.collectives.checks import (
    check_algorithm,
    check_device,
    check_flag,
    check_moved,
    check_pair,
    check_same_result_on_every_rank,
    check_timeout,
    outside_group,
)
from commpress.collectives.executor import execute
from commpress.collectives.failures import named_failures
from commpress.collectives.fingerprint import Fingerprint
from commpress.collectives.payloads import Gathered
from commpress.collectives.work import (
    launch,
    queued_on,
    run_native,
    staged,
    writable,
    write_into,
)
from commpress.schedules import algorithms, plan
from commpress.transport import backends, collective

ALL_GATHER_ALGORITHMS = algorithms("all_gather")


def all_gather_into_tensor(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    codec: str | Codec = "int8",
    algorithm: str = "ring",
    async_op: bool = False,
    timeout: timedelta | None = None,
):
    """Gather every rank's ``inp`` into ``out`` (``world_size * inp.numel()`` elements).

    Same convention as :func:`torch.distributed.all_gather_into_tensor`, plus ``codec``
    and ``algorithm`` (``codec`` is ignored by ``native``). ``algorithm="auto"`` and
    ``codec="auto:max_rel_err=E"`` let the cost model choose (:mod:`commpress.sim.tuner`).
    A peer that dies or stalls longer than ``timeout`` (default: the process group's)
    raises on every other rank.
    Ranks that disagree on the arguments (size, dtype, codec, algorithm) all raise
    :class:`~commpress.collectives.fingerprint.CollectiveMismatchError` before ``out`` is
    written (``native`` excepted: that is torch's own collective). A peer that dies or
    stalls once every rank is known to agree can leave ``out`` partly written, as a failing
    torch collective does.
    """
    if outside_group(group, "all_gather_into_tensor"):
        return None
    group = backends.or_world(group)  # the default group now, not when the call runs
    check_timeout(timeout)
    check_flag(async_op, "async_op")
    check_pair(out, inp, world_size=dist.get_world_size(group), gather=True)
    if auto.requested(codec, algorithm):  # its choice is agreed on over the group: first
        check_moved(inp, group)
        algorithm, codec = auto.resolve("all_gather", inp, group, codec, algorithm, timeout=timeout)
    check_algorithm(algorithm, ALL_GATHER_ALGORITHMS, True, "all_gather_into_tensor")
    check_device(algorithm, "all_gather", inp, group)
    if algorithm == "native":
        shard, (gathered, copy_back) = inp.contiguous(), staged(out)
        start = lambda: collective.all_gather(gathered, shard, group)  # noqa: E731
        tensors = (out, inp, gathered, shard)
        return run_native(
            "all_gather_into_tensor", start, group, async_op, timeout, tensors, copy_back
        )
    codec = get_codec(codec)
    codec.check_dtype(inp.dtype, "inp.dtype")
    check_same_result_on_every_rank(codec, algorithm)
    fingerprint = Fingerprint.of("all_gather", inp, codec, algorithm)
    inp = inp.contiguous()
    written = writable(out)

    def run() -> None:
        with named_failures("all_gather_into_tensor", codec, algorithm, group, timeout):
            gather(written, inp, group, codec, algorithm, timeout, fingerprint, written is out)
        if written is not out:
            write_into(out, written)

    return queued_on(group, launch(run, async_op, (out, inp, written)))


def gather(
    out,
    inp,
    group,
    codec: Codec,
    algorithm: str,
    timeout,
    fingerprint: Fingerprint | None = None,
    stream_output: bool = False,
) -> None:
    """The all-gather itself, on the calling thread (arguments already checked); with
    ``fingerprint``, after every rank has agreed on it. ``stream_output``: ``out`` is the
    caller's, left to it (:class:`~commpress.collectives.payloads.Gathered`)."""
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    (schedule,) = plan("all_gather", algorithm, rank, world_size, inp.numel(), inp.dtype, codec)
    payloads = Gathered(out, inp, codec, schedule, stream_output)
    execute(schedule, payloads, group, timeout, fingerprint)
