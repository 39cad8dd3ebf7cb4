"""``algorithm="auto"`` and ``codec="auto:..."`` resolved for one call by the tuner
(:mod:`commpress.sim.tuner`), before the call's other checks."""

from __future__ import annotations

import torch
import torch.distributed as dist

from commpress.sim import tuner
from commpress.transport import backends, multicast

AUTO = tuner.AUTO


def resolve(
    op: str,
    inp: torch.Tensor,
    group,
    codec,
    algorithm: str,
    error_feedback: bool = False,
    chunk_bytes: int | None = None,
) -> tuple[str, object]:
    """``(algorithm, codec)`` to run: as given, or the tuner's choice where either is auto
    (for a reduce-scatter cut in pieces of ``chunk_bytes``)."""
    if algorithm != AUTO and not tuner.is_auto(codec):
        return algorithm, codec
    choice = tuner.choose(
        op,
        inp.numel(),
        inp.dtype,
        dist.get_world_size(group),
        codec,
        algorithm,
        on_cpu=inp.device.type == "cpu",
        backend=backends.name(group),
        error_feedback=error_feedback,
        chunk_bytes=chunk_bytes,
        placement=placement(group),
        multicast=multicast_options(group, algorithm),
    )
    return choice.algorithm, choice.codec


def multicast_options(group, algorithm: str) -> multicast.Options | None:
    """The options ``group``'s multicast paces with, where the call may run a multicast;
    else None, and None where this rank cannot read them: the channel's set-up names that
    on every rank, where raising here would leave the other ranks waiting."""
    may_multicast = algorithm == "multicast" or (
        algorithm == AUTO and "multicast" in tuner.network().algorithms
    )
    if not may_multicast:
        return None
    try:
        return multicast.options_of(group)
    except ValueError:
        return None


def placement(group) -> tuner.Placement | None:
    """Where ``group``'s ranks sit in the tuner's network: on the hosts of their global
    ranks; None for the whole world in order."""
    if group is None:
        return None
    network_hosts = dist.get_world_size()
    hosts = tuple(dist.get_process_group_ranks(group))
    if hosts == tuple(range(network_hosts)):
        return None
    return tuner.Placement(hosts, network_hosts)
