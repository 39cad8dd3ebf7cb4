"""What FSDP2 gains when it waits on commpress's all-gathers instead of blocking on each.

``python benchmarks/fsdp_overlap_2026-11-28/overlap.py HOSTS LINK ROUNDS SPEC [forward]``
(root; prefix ``cpov``): the training demo's GPT (its default size) with FSDP2 on HOSTS
emulated hosts, all-gather and reduce-scatter ``SPEC`` (e.g. ``int8``); ``forward`` also
prefetches each block's all-gather one block ahead in forward. Each round times one
training step (forward, backward, AdamW) in each mode, their order alternating:

- ``waited``: ``cp.fsdp.compress(..., unshard_async_op=True)``: FSDP2 calls them with
  ``async_op=True`` and waits where it needs the parameters;
- ``blocking``: FSDP2's default, ``async_op=False`` (every all-gather blocks the
  training thread until it has finished).

Both modes train the same model, so the rounds also check that they keep the same bits.
Prints the medians of the slowest rank's step and the paired difference.
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import commpress as cp
from commpress.bench.paired import paired_difference, slowest_rank_seconds
from commpress.cluster import Emulated
from commpress.train.model import GPT, GPTConfig

WARMUP = 3
MODES = ("waited", "blocking")


def _model(spec: str, forward_prefetch: bool, waited: bool) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    mesh = cp.fsdp.cpu_mesh()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if forward_prefetch:
        blocks = list(model.blocks)
        for block, following in zip(blocks, blocks[1:], strict=False):
            block.set_modules_to_forward_prefetch([following])
    cp.fsdp.compress(model, all_gather=spec, reduce_scatter=spec, unshard_async_op=waited)
    return model


def _step(model: GPT, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> None:
    model.loss(tokens[:, :-1], tokens[:, 1:]).backward()
    optimizer.step()
    optimizer.zero_grad()


def _rounds(rank: int, world_size: int, rounds: int, spec: str, forward_prefetch: bool):
    models = {mode: _model(spec, forward_prefetch, mode == "waited") for mode in MODES}
    optimizers = {mode: torch.optim.AdamW(m.parameters(), lr=1e-3) for mode, m in models.items()}
    generator = torch.Generator().manual_seed(rank)
    times = {mode: [] for mode in models}
    for index in range(WARMUP + rounds):
        tokens = torch.randint(0, 256, (8, 65), generator=generator)
        order = list(models) if index % 2 == 0 else list(reversed(models))
        for mode in order:
            step = functools.partial(_step, models[mode], optimizers[mode], tokens)
            seconds = slowest_rank_seconds(step)
            if index >= WARMUP:
                times[mode].append(seconds)
    same = all(
        torch.equal(a.full_tensor(), b.full_tensor())
        for a, b in zip(models["waited"].parameters(), models["blocking"].parameters(), strict=True)
    )
    dist.barrier()
    return times, same


def main(hosts: int, link: str, rounds: int, spec: str, forward_prefetch: bool) -> None:
    with Emulated(hosts, link, prefix="cpov") as cluster:
        results = cluster.run(_rounds, rounds, spec, forward_prefetch, timeout=3600)
    times, same = results[0]
    print(f"{hosts} hosts at {link}, {spec}, forward prefetch {forward_prefetch}, {rounds} rounds")
    for mode, values in times.items():
        print(f"{mode:9s} median step {1e3 * statistics.median(values):8.2f} ms")
    median, low, high = paired_difference(times["waited"], times["blocking"])
    ratio = statistics.median(times["blocking"]) / statistics.median(times["waited"])
    print(
        f"waited - blocking: {1e3 * median:+.2f} ms ({1e3 * low:+.2f} to {1e3 * high:+.2f}), "
        f"blocking / waited {ratio:.3f}"
    )
    same = all(result[1] for result in results)
    print(f"both modes hold the same parameters after the last round, on every rank: {same}")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], "forward" in sys.argv[5:])
