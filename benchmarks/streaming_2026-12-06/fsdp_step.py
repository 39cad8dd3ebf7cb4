"""An FSDP2 training step with the int8 all-gather's decodes streamed past the caches, and
without: what the copy-out (and the forward) that read the gathered parameters right after
pay for finding them in memory. Both in the same processes, step by step interleaved; then
how many of one step's native decodes asked to stream.

``python benchmarks/streaming_2026-12-06/fsdp_step.py HOSTS ROUNDS`` (root; HOSTS hosts at
1 Gbit/s, prefix ``cpfs``). The model: 4 blocks of Linear(512, 2048), GELU,
Linear(2048, 512), each its own FSDP2 unit (2.1M parameters: each all-gather decodes 2 MiB
per rank, past ``STREAM_MIN_BYTES``), batch 32, SGD; ``cp.fsdp.compress(model,
all_gather="int8", reduce_scatter="int8")``. "without" sets ``STREAM_MIN_BYTES`` past any
size for its steps. Prints each variant's median step time (slowest rank) and the paired
difference without - with, and its 95% interval."""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import commpress as cp
from commpress.bench.paired import interleaved_rounds, paired_difference
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.codecs import blockwise
from commpress.testing.stream_requests import recorded_stream_requests

DIM, BLOCKS, BATCH, WARMUP = 512, 4, 32, 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        for _ in range(BLOCKS)
    ]
    model = nn.Sequential(*blocks)
    mesh = cp.fsdp.cpu_mesh()
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    cp.fsdp.compress(model, all_gather="int8", reduce_scatter="int8")
    return model


def worker(rank, world_size, rounds):
    torch.set_num_threads(1)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(rank))

    def step() -> None:
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()

    streamed_from = blockwise.STREAM_MIN_BYTES

    def switch(variant: str):
        blockwise.STREAM_MIN_BYTES = streamed_from if variant == "with" else 1 << 62
        return lambda: setattr(blockwise, "STREAM_MIN_BYTES", streamed_from)

    times = interleaved_rounds(step, ["with", "without"], rounds, switch, WARMUP)
    with recorded_stream_requests() as asked:  # what one step's decodes asked, streaming on
        step()
    dist.barrier()
    return times, (sum(asked), len(asked))


def main() -> None:
    hosts, rounds = int(sys.argv[1]), int(sys.argv[2])
    with cluster_for(hosts, "1gbit", prefix="cpfs") as cluster:
        times, (streamed, decodes) = cluster.run(worker, rounds, timeout=3600)[0]
    print(f"FSDP2 step, {hosts} hosts at 1 Gbit/s, {rounds} rounds, int8 all-gather and "
          "reduce-scatter; median step time of the slowest rank (ms)")  # fmt: skip
    for variant, values in times.items():
        print(f"- decodes streamed {variant}: {statistics.median(values) * 1e3:.2f}")
    middle, low, high = (1e3 * t for t in paired_difference(times["without"], times["with"]))
    print(f"- without - with: {middle:+.2f} ({low:+.2f} to {high:+.2f})")
    print(f"- native decodes of one step (rank 0) that asked to stream: {streamed} of {decodes}")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
