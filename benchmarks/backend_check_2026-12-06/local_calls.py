"""Scratch timing on two local gloo processes (no emulation), kept so that the README's
figures can be rerun: ``python benchmarks/backend_check_2026-12-06/local_calls.py``."""

import cProfile
import io
import pstats
import time

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.codecs import get_codec
from commpress.collectives.all_gather import gather
from commpress.collectives.fingerprint import Fingerprint


def f(rank, world):
    inp, out = torch.randn(1 << 16), torch.empty(world << 16)
    codec = get_codec("int8")
    fp = Fingerprint.of("all_gather", inp, codec, "backend")
    g = dist.group.WORLD
    res = {}
    for name, call in (
        ("public", lambda: cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="backend")),
        ("checked", lambda: gather(out, inp, g, codec, "backend", None, fp)),
        ("bare", lambda: gather(out, inp, g, codec, "backend", None)),
    ):
        for _ in range(20):
            call()
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(300):
            call()
        res[name] = ((time.perf_counter() - t0) / 300 * 1e3, (time.process_time() - c0) / 300 * 1e3)
    if rank == 0:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="backend")
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
        res["prof"] = s.getvalue()
    else:
        for _ in range(300):
            cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="backend")
    return res


if __name__ == "__main__":
    r = run_distributed(f, 2, timeout=300)
    for k in ("public", "checked", "bare"):
        print(k, "wall ms {:.3f}, process cpu ms {:.3f}".format(*r[0][k]))
    print(r[0]["prof"])
