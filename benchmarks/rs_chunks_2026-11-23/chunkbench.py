"""Reduce-scatter ``ring`` at several piece sizes (``chunk_bytes``) against ``ring-hop``:
each rank's median time over 5 calls (after one warm-up), the slowest rank's kept. Lives in
its own module so the emulated cluster's workers can unpickle ``measure``."""

import statistics
import time

import torch
import torch.distributed as dist

import commpress as cp


def measure(rank, world_size, sizes, chunks, codec):
    torch.set_num_threads(1)
    rows = []
    for size in sizes:
        inp = torch.randn(size // 4, generator=torch.Generator().manual_seed(rank))
        out = torch.empty(size // 4 // world_size)
        for label, kwargs in [("ring-hop", dict(algorithm="ring-hop"))] + [
            (f"ring {c >> 20}M", dict(algorithm="ring", chunk_bytes=c)) for c in chunks
        ]:
            times = []
            for i in range(6):
                dist.barrier()
                start = time.perf_counter()
                cp.reduce_scatter_tensor(out, inp, codec=codec, **kwargs)
                elapsed = torch.tensor(time.perf_counter() - start)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if i:
                    times.append(elapsed.item())
            rows.append((size >> 20, label, statistics.median(times)))
    return rows
