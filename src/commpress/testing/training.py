"""A few SGD steps of a small classifier on random data: the loop the DDP tests share."""

from __future__ import annotations

import torch
import torch.nn.functional as F

CLASSES = 10


def sgd_steps(
    model: torch.nn.Module,
    steps: int,
    rank: int,
    *,
    features: int,
    batch: int,
    seed_stride: int,
    device: torch.device | str = "cpu",
) -> list[float]:
    """Train ``model`` (``features`` in, ``CLASSES`` out; DDP-wrapped or not) ``steps``
    steps of SGD at lr 0.05. Step ``s`` on ``rank`` draws its ``batch`` samples with seed
    ``seed_stride * s + rank``. Returns each step's loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        generator = torch.Generator().manual_seed(seed_stride * step + rank)
        x = torch.randn(batch, features, generator=generator)
        y = torch.randint(0, CLASSES, (batch,), generator=generator)
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
