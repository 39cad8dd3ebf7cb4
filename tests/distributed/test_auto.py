"""``algorithm="auto"`` runs what the tuner chose, on every rank alike."""

from __future__ import annotations

import torch

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.collectives import auto
from commpress.sim import tuner


def _auto_against_the_choice(rank, world_size):
    tuner.configure(link="1gbit")
    results = []
    for numel in (96, 1 << 16):
        generator = torch.Generator().manual_seed(rank)
        shard = torch.randn(numel, generator=generator)
        whole = torch.randn(numel * world_size, generator=generator)
        gathered, expected = torch.empty(numel * world_size), torch.empty(numel * world_size)
        cp.all_gather_into_tensor(gathered, shard, codec="int8", algorithm="auto")
        chosen = tuner.choose("all_gather", numel, torch.float32, world_size, "int8")
        cp.all_gather_into_tensor(expected, shard, codec=chosen.codec, algorithm=chosen.algorithm)
        reduced, reference = torch.empty(numel), torch.empty(numel)
        cp.reduce_scatter_tensor(reduced, whole, codec="auto:max_rel_err=1e-2", algorithm="auto")
        picked = tuner.choose("reduce_scatter", whole.numel(), torch.float32, world_size,
                              "auto:max_rel_err=1e-2")  # fmt: skip
        cp.reduce_scatter_tensor(reference, whole, codec=picked.codec, algorithm=picked.algorithm)
        results.append((torch.equal(gathered, expected), torch.equal(reduced, reference),
                        str(chosen), str(picked), gathered))  # fmt: skip
    return results, _placements()


def _placements():
    """Where the tuner puts the world, a subgroup of ranks 0 and 2 (on its members), and a
    subgroup of every rank in order."""
    strided = torch.distributed.new_group([0, 2])
    every = torch.distributed.new_group([0, 1, 2])
    mine = auto.placement(strided) if torch.distributed.get_rank() != 1 else "outside"
    asked = []  # what a reduce-scatter on the strided group asks the tuner
    choose, tuner.choose = (
        tuner.choose,
        lambda *args, **kwargs: asked.append(kwargs) or (choose(*args, **kwargs)),
    )
    try:
        if torch.distributed.get_rank() != 1:
            out, inp = torch.empty(8), torch.ones(16)
            cp.reduce_scatter_tensor(out, inp, group=strided, algorithm="auto", chunk_bytes=1024)
    finally:
        tuner.choose = choose
    passed = [(kwargs["placement"], kwargs["chunk_bytes"]) for kwargs in asked]
    return auto.placement(None), mine, auto.placement(every), passed


def test_auto_runs_the_tuners_choice_and_every_rank_agrees_and_places_subgroups():
    by_rank, placements = zip(
        *run_distributed(_auto_against_the_choice, 3, timeout=120), strict=True
    )
    strided = tuner.Placement(hosts=(0, 2), network_hosts=3)
    asked = [(strided, 1024)]  # by the call that runs on the subgroup
    assert placements == (
        (None, strided, None, asked),
        (None, "outside", None, []),
        (None, strided, None, asked),
    )
    for size in range(2):
        choices = {(r[size][2], r[size][3]) for r in by_rank}
        assert len(choices) == 1, choices
        for rank_results in by_rank:
            same_gather, same_reduce, _, _, gathered = rank_results[size]
            assert same_gather and same_reduce
            assert torch.equal(gathered, by_rank[0][size][4])
