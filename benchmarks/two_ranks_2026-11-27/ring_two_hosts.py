"""The commpress ring all-gather (codec ``none``; ``OP=reduce_scatter``: the reduce-scatter)
against torch's own, six timed calls each, twice, on the emulated cluster; rank 0 prints
milliseconds and the ideal ``(n - 1) x shard / link`` (NUMEL: the shard's fp32 values).
Run it once per library version to compare (``PYTHONPATH`` of a worktree of the older
commit):

    commpress cluster up --hosts 2 --link 1gbit --prefix qx
    PYTHONPATH=SRC NUMEL=8388608 commpress launch --prefix qx -- \\
        python benchmarks/two_ranks_2026-11-27/ring_two_hosts.py
    commpress cluster down --prefix qx
"""

import os

import torch
import torch.distributed as dist
from timed import print_times

import commpress as cp


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = int(os.environ.get("NUMEL", 1 << 21))
    inp, out = torch.full((numel,), float(rank)), torch.empty(world * numel)
    ideal_ms = numel * 4 * 8 * (world - 1) / 1e9 * 1e3

    if os.environ.get("OP", "all_gather") == "reduce_scatter":
        inp, out = out, inp  # the whole in, one shard out

        def ring():
            cp.reduce_scatter_tensor(out, inp, codec="none", algorithm="ring")

        def native():
            dist.reduce_scatter_tensor(out, inp)
    else:

        def ring():
            cp.all_gather_into_tensor(out, inp, codec="none", algorithm="ring")

        def native():
            dist.all_gather_into_tensor(out, inp)

    for name, call in (("cp-ring", ring), ("native", native)) * 2:
        print_times(name, call, ideal_ms)


if __name__ == "__main__":
    main()
