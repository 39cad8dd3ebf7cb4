"""How far a compressed collective's result may be from the exact one: bounds for tests.

A test compares what a compressed collective delivered (inside FSDP or DDP, say) with
an exact float64 reference. The bounds here need only the largest magnitude each rank
contributed, not the layout the collective cut its buffer into (FSDP and DDP flatten
several parameters into one buffer whose blocks a test need not reproduce): every
codec's ``error_bound`` grows with ``|x|`` and with the largest magnitude in ``x``'s
block, so its value at a tensor's largest magnitude bounds the error of each element.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from commpress.codecs import Codec

#: Wrong results a check must reject, applied in place to what a collective delivered.
CORRUPTIONS = {
    "zeroed": torch.Tensor.zero_,
    "negated": torch.Tensor.neg_,
    "doubled": lambda t: t.mul_(2),  # a SUM where AVG was asked, at world size 2
}


def codec_error(codec: Codec, magnitude: float) -> float:
    """Largest ``|decode(encode(x)) - x|`` of any element of any ``x`` with ``|x| <= magnitude``."""
    return float(codec.error_bound(torch.tensor([float(magnitude)])).max())


def all_gather_error(codec: Codec, algorithm: str, magnitude: float, world_size: int) -> float:
    """Bound on ``|gathered - shard|`` for shards whose magnitudes are at most ``magnitude``.

    ``ring`` and ``backend`` encode each shard once, at its owner; ``ring-hop`` decodes and
    re-encodes at every hop, so the rank farthest from the owner holds ``world_size - 1``
    encodings.
    """
    if algorithm == "native" or codec.lossless:
        return 0.0
    error = 0.0
    for _ in range(world_size - 1 if algorithm == "ring-hop" else 1):
        error += codec_error(codec, magnitude + error)
    return error


def reduce_scatter_error(
    codec: Codec,
    algorithm: str,
    magnitudes: list[float],
    residuals: list[float] | None = None,
) -> float:
    """Bound on ``|delivered sum - exact sum|`` of one element (divide by n for AVG).

    ``magnitudes``: each rank's largest ``|contribution|``. ``alltoall`` encodes every
    contribution but the destination's own once. ``ring`` and ``ring-hop``: hop k encodes
    a partial sum of k contributions plus what the earlier hops lost. ``residuals``
    (error feedback, ``alltoall``): each rank's largest ``|residual|`` before this step;
    a rank then encodes contribution + residual and delivers it less the new residual.
    """
    if algorithm == "native" or codec.lossless:
        return 0.0
    if algorithm in ("alltoall", "backend"):  # the same schedule
        residuals = residuals or [0.0] * len(magnitudes)
        errors = [r + codec_error(codec, m + r) for m, r in zip(magnitudes, residuals, strict=True)]
        return sum(sorted(errors)[1:])
    if residuals is not None:
        raise ValueError(f"error feedback needs algorithm='alltoall', got {algorithm!r}")
    largest = sorted(magnitudes, reverse=True)
    error = 0.0
    for k in range(1, len(largest)):
        error += codec_error(codec, sum(largest[:k]) + error)
    return error


def all_reduce_error(codec: Codec, algorithm: str, magnitudes: list[float]) -> float:
    """Bound on ``|delivered - exact mean|`` of an AVG all-reduce: a reduce-scatter, the
    division, then an all-gather of each reduced chunk (``ring-hop`` re-encodes there too)."""
    if algorithm == "native" or codec.lossless:
        return 0.0
    n = len(magnitudes)
    reduced = reduce_scatter_error(codec, algorithm, magnitudes) / n
    gather = "ring-hop" if algorithm == "ring-hop" else "ring"
    return reduced + all_gather_error(codec, gather, sum(magnitudes) / n + reduced, n)


def sgd_update_ratio(
    before: list[torch.Tensor],
    after: list[torch.Tensor],
    contributions: list[list[torch.Tensor]],
    lr: float,
    gradient_error: float,
) -> float:
    """How far one SGD step strayed from the exact data-parallel step, over what it may.

    ``before`` / ``after``: parameters around the step; ``contributions[r]``: rank r's own
    gradients of them, at the parameters the step's forward used. Returns the largest
    ``|(before - after) - lr * mean_r(contributions[r])|`` over ``lr * gradient_error``
    (the bound on the delivered gradient's error) plus fp32 rounding: at most 1 when the
    gradient the step applied is within ``gradient_error`` of the exact mean.
    """
    n = len(contributions)
    magnitude = sum(max(float(g.abs().max()) for g in grads) for grads in contributions)
    largest = max(float(p.abs().max()) for p in [*before, *after])
    eps = torch.finfo(torch.float32).eps
    rounding = eps * (2 * largest + lr * n * magnitude)  # the fp32 sum, the update, the step
    worst = 0.0
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        exact = sum(grads[i].double() for grads in contributions) / n
        worst = max(worst, float((old.double() - new.double() - lr * exact).abs().max()))
    return worst / (lr * gradient_error + rounding)


def from_every_rank(tensors: list[torch.Tensor], group=None) -> list[list[torch.Tensor]]:
    """``result[r]``: rank r's ``tensors`` (same shapes on every rank), by torch's all-gather."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, flat, group=group)
    sizes = [t.numel() for t in tensors]
    return [
        [part.view_as(t) for part, t in zip(f.split(sizes), tensors, strict=True)] for f in everyone
    ]
