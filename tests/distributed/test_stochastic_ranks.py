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


def _rounding_through_dcp(rank, world_size, directory):
    import dataclasses

    import torch.distributed.checkpoint as dcp

    x = torch.linspace(-0.93, 0.93, 2048)
    codec = dataclasses.replace(cp.get_codec(SPEC))
    codec.encode(x)  # the stream moves on from its seed
    dcp.save({"rounding": codec.rounding_state()}, checkpoint_id=directory)
    uninterrupted = codec.encode(x)
    resumed = dataclasses.replace(codec)  # as a new process's: its template has no stream
    template = {"rounding": resumed.rounding_state()}
    dcp.load(template, checkpoint_id=directory)
    resumed.load_rounding_state(template["rounding"])
    return uninterrupted, resumed.encode(x)


def test_rounding_states_saved_through_dcp_continue_each_rank_its_own_stream(tmp_path):
    """One torch.distributed.checkpoint of every rank's streams: each rank continues its own
    (under one key, DCP would keep one rank's, and every rank would continue it)."""
    outcomes = run_distributed(_rounding_through_dcp, 2, str(tmp_path / "dcp"), timeout=120)
    for uninterrupted, resumed in outcomes:
        assert torch.equal(resumed, uninterrupted)
    assert not torch.equal(outcomes[0][0], outcomes[1][0])  # the ranks' streams differ
