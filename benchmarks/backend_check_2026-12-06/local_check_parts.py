"""Scratch timing on two local gloo processes (no emulation), kept so that the README's
figures can be rerun: ``python benchmarks/backend_check_2026-12-06/local_check_parts.py``."""

import collections
import time

import torch
import torch.distributed as dist

from commpress.cluster.local import run_distributed
from commpress.codecs import get_codec
from commpress.collectives import executor, inband
from commpress.collectives.all_gather import gather
from commpress.collectives.fingerprint import Fingerprint
from commpress.transport import p2p


def f(rank, world):
    acc = collections.defaultdict(float)

    def timed(obj, name):
        orig = getattr(obj, name)

        def w(*a, **k):
            t = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                acc[name] += time.perf_counter() - t

        setattr(obj, name, w)

    for n in (
        "post_header",
        "settle",
        "_every_rank_agrees",
        "accept_first",
        "_post_verdict",
        "stamp",
        "first_scratch",
    ):
        timed(inband.Check, n)
    timed(p2p.Batch, "wait")
    timed(p2p.Batch, "__init__")
    timed(executor, "_encode_own")
    timed(executor, "_run_steps")
    inp, out = torch.randn(1 << 16), torch.empty(world << 16)
    codec = get_codec("int8")
    fp = Fingerprint.of("all_gather", inp, codec, "backend")
    g = dist.group.WORLD
    for _ in range(20):
        gather(out, inp, g, codec, "backend", None, fp)
    acc.clear()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(300):
        gather(out, inp, g, codec, "backend", None, fp)
    total = (time.perf_counter() - t0) / 300 * 1e3
    return total, {k: v / 300 * 1e3 for k, v in acc.items()}


if __name__ == "__main__":
    for total, parts in run_distributed(f, 2, timeout=300):
        print(f"total {total:.3f} ms", {k: round(v, 3) for k, v in sorted(parts.items())})
