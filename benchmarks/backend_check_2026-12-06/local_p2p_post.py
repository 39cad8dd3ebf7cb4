"""Scratch timing on two local gloo processes (no emulation), kept so that the README's
figures can be rerun: ``python benchmarks/backend_check_2026-12-06/local_p2p_post.py``."""

import time

import torch
import torch.distributed as dist

from commpress.cluster.local import run_distributed


def f(rank, world):
    g = dist.group.WORLD
    peer = 1 - rank
    small, big, hdr = (
        torch.empty(32, dtype=torch.uint8),
        torch.empty(8 << 20, dtype=torch.uint8),
        torch.zeros(32, dtype=torch.uint8),
    )
    res = {}
    for name, buf in (("recv32", small), ("recv8M", big), ("recv32b", small), ("recv8Mb", big)):
        post = 0.0
        total = 0.0
        for _i in range(300):
            dist.barrier()
            t0 = time.perf_counter()
            r = g.recv([buf], peer, 0)
            s = g.send([hdr], peer, 0)
            t1 = time.perf_counter()
            s.wait()
            r.wait()
            total += time.perf_counter() - t0
            post += t1 - t0
        res[name] = (post / 300 * 1e3, total / 300 * 1e3)
    return res


if __name__ == "__main__":
    for r in run_distributed(f, 2, timeout=300):
        print({k: tuple(round(x, 3) for x in v) for k, v in r.items()})
