"""The backend's own collectives (gloo's, NCCL's), as the transport of a schedule's step and
as the ``native`` algorithm. Each returns torch's ``Work``; wait on it with
:func:`commpress.transport.p2p.wait`."""

from __future__ import annotations

import torch
import torch.distributed as dist

from commpress.transport.owned_groups import track


def all_gather(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None):
    work = _named("all_gather_single", "all_gather_into_tensor")(
        out, inp, group=group, async_op=True
    )
    return track(group, work, inp.is_cpu)


def all_to_all(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None):
    work = dist.all_to_all_single(out, inp, group=group, async_op=True)
    return track(group, work, inp.is_cpu)


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, op, group: dist.ProcessGroup | None):
    work = _named("reduce_scatter_single", "reduce_scatter_tensor")(
        out, inp, op=op, group=group, async_op=True
    )
    return track(group, work, inp.is_cpu)


def all_reduce(tensor: torch.Tensor, op, group: dist.ProcessGroup | None):
    work = dist.all_reduce(tensor, op=op, group=group, async_op=True)
    return track(group, work, tensor.is_cpu)


def _named(name: str, before_torch_2_13: str):
    """torch.distributed's function ``name``, or its name before torch 2.13 (which renamed
    it and deprecated the old one); looked up at each call, so that
    ``commpress.testing.silence`` can replace it."""
    return getattr(dist, name, None) or getattr(dist, before_torch_2_13)
