"""Stochastic rounding on several ranks: each rank draws its own noise."""

from __future__ import annotations

import torch

import commpress as cp
from commpress.cluster.local import run_distributed

SPEC = "int8:stochastic=true,block=64"
CALLS = 32


def _decodes(rank, world_size):
    x = torch.linspace(-0.93, 0.93, 2048)
    x[::64] = 1.0
    codec = cp.get_codec(SPEC)
    return x, [codec.decode(codec.encode(x), x.numel(), x.dtype) for _ in range(CALLS)]


def test_ranks_draw_different_noise_and_their_mean_converges():
    results = run_distributed(_decodes, 4, timeout=120)
    x = results[0][0]
    firsts = [decodes[0] for _, decodes in results]
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.equal(firsts[a], firsts[b]), (a, b)

    def error(decodes):
        rounded = x != 1.0
        mean = torch.stack([d.double() for d in decodes]).mean(dim=0)
        return (mean - x.double())[rounded].pow(2).mean().sqrt().item()

    one_rank = error(results[0][1])
    all_ranks = error([d for _, decodes in results for d in decodes])
    # 4x the independent draws: the error of the mean halves; shared noise would not shrink.
    assert 1.5 < one_rank / all_ranks < 2.7, (one_rank, all_ranks)
