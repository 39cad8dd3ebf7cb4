"""All-gather with compression at the collective level (IPDPS'23), and its two baselines.

* ``native``: ``torch.distributed.all_gather_into_tensor`` on the raw tensor.
* ``ring``: each rank encodes its shard once; payloads travel the ring unchanged;
  a received payload is decoded while the next one is in flight. The owner keeps
  the *decoded* copy of its own shard, so all ranks end bitwise identical.
* ``ring-hop``: the same ring, but every hop decodes and re-encodes before sending,
  as MPI libraries that compress point-to-point messages do.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.algorithms.ring import all_gather_steps, neighbours
from commpress.codecs import Codec, get_codec
from commpress.collectives.checks import (
    check_algorithm,
    check_pair,
    check_same_result_on_every_rank,
)
from commpress.collectives.fingerprint import Agreement, Fingerprint
from commpress.collectives.work import launch
from commpress.collectives.workspace import workspace
from commpress.transport.p2p import Exchange, wait

ALL_GATHER_ALGORITHMS = ("native", "ring", "ring-hop")


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
    and ``algorithm`` (``codec`` is ignored by ``native``). A peer that dies or stalls
    longer than ``timeout`` (default: the process group's) raises on every other rank.
    Ranks that disagree on the arguments (size, dtype, codec, algorithm) all raise
    :class:`~commpress.collectives.fingerprint.CollectiveMismatchError` before ``out`` is
    written (``native`` excepted: that is torch's own collective).
    """
    check_algorithm(algorithm, ALL_GATHER_ALGORITHMS)
    check_pair(out, inp, world_size=dist.get_world_size(group), gather=True)
    if algorithm == "native":
        work = dist.all_gather_single(out, inp, group=group, async_op=True)
        return work if async_op else wait(work, timeout)
    codec = get_codec(codec)
    codec.check_dtype(inp.dtype, "inp.dtype")
    check_same_result_on_every_rank(codec, algorithm)
    hop = algorithm == "ring-hop"
    fingerprint = Fingerprint.of("all_gather", inp, codec, algorithm)

    def run() -> None:
        agreement = Agreement(group, fingerprint, timeout, inp.device)
        ring_all_gather(out, inp, group, codec, hop, timeout, gate=agreement.check)

    return launch(run, async_op, (out, inp))


def ring_all_gather(
    out,
    inp,
    group,
    codec: Codec,
    recompress_every_hop: bool,
    timeout: timedelta | None,
    gate: Callable[[], None] | None = None,
) -> None:
    """The ring itself, on the calling thread (arguments already checked).

    ``gate`` runs after the own shard is encoded and before ``out`` is written or anything
    is sent (the argument check of :class:`~commpress.collectives.fingerprint.Agreement`).
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    numel, dtype = inp.numel(), inp.dtype
    chunks = out.view(world_size, numel)
    wire = codec.wire_bytes(numel, dtype)
    payloads = workspace.take("all_gather.payloads", world_size * wire, torch.uint8, inp.device)
    payloads = payloads.view(world_size, wire)
    codec.encode(inp, out=payloads[rank])
    if gate is not None:
        gate()
    codec.decode(payloads[rank], numel, dtype, out=chunks[rank])
    left, right = neighbours(rank, world_size)
    undecoded = None
    for step in all_gather_steps(rank, world_size):
        exchange = Exchange(group, payloads[step.send], right, payloads[step.recv], left)
        if undecoded is not None:  # overlaps with the transfer in flight
            codec.decode(payloads[undecoded], numel, dtype, out=chunks[undecoded])
        exchange.wait(timeout)
        if recompress_every_hop:
            codec.decode(payloads[step.recv], numel, dtype, out=chunks[step.recv])
            codec.encode(chunks[step.recv], out=payloads[step.recv])
        else:
            undecoded = step.recv
    if undecoded is not None:
        codec.decode(payloads[undecoded], numel, dtype, out=chunks[undecoded])
