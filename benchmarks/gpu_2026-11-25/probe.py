"""What one GPU can tell about commpress: codec speed on CUDA and the fixed cost of a
compressed collective on a one-rank NCCL group, each against a baseline in the same
process. Usage: python probe.py codecs|fixed|two_ranks  (prints a markdown table)."""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed

REPEATS = 30


def _median_ms(fn, repeats=REPEATS):
    """Median wall time of ``fn`` in ms, the GPU synchronised around each call."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def codecs():
    numel = 16 << 20
    print("| codec | dtype | first call s | encode ms | decode ms | encode GB/s | copy ms |")
    print("|---|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(numel, device="cuda", dtype=dtype)
        copy_ms = _median_ms(lambda x=x: x.clone())
        for spec in ("none", "bf16", "fp8", "int8", "int4"):
            codec = cp.get_codec(spec)
            torch.cuda.synchronize()
            start = time.perf_counter()
            payload = codec.encode(x)
            codec.decode(payload, numel, dtype)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            enc = _median_ms(lambda codec=codec, x=x: codec.encode(x))
            dec = _median_ms(lambda c=codec, p=payload, d=dtype: c.decode(p, numel, d))
            gbs = x.numel() * x.element_size() / enc / 1e6
            name = str(dtype).removeprefix("torch.")
            times = f"{first:.2f} | {enc:.3f} | {dec:.3f} | {gbs:.0f} | {copy_ms:.3f}"
            print(f"| {spec} | {name} | {times} |")
    sys.stdout.flush()


def _cases(out, inp):
    """The calls timed by ``fixed``: torch's own all-gather and commpress's, each also as
    ``async_op=True`` followed by ``wait()`` (how FSDP2 overlaps them)."""
    cases = {
        "native": lambda: dist.all_gather_into_tensor(out, inp),
        "native async+wait": lambda: dist.all_gather_into_tensor(out, inp, async_op=True).wait(),
    }
    for spec, algorithm in (("none", "ring"), ("int8", "ring"), ("int8", "backend")):
        name = f"{spec}@{algorithm}"
        cases[name] = lambda s=spec, a=algorithm: cp.all_gather_into_tensor(
            out, inp, codec=s, algorithm=a
        )
        cases[f"{name} async+wait"] = lambda s=spec, a=algorithm: cp.all_gather_into_tensor(
            out, inp, codec=s, algorithm=a, async_op=True
        ).wait()
    return cases


def _fixed(rank, world_size):
    torch.cuda.set_device(0)
    rows = []
    for numel in (1024, 1 << 24):
        inp = torch.randn(numel, device="cuda")
        out = torch.empty(numel * world_size, device="cuda")
        for name, fn in _cases(out, inp).items():
            for _ in range(5):
                fn()
            rows.append((numel * 4, name, _median_ms(fn, 100)))
    return rows


def fixed():
    rows = run_distributed(_fixed, 1, backend="nccl", timeout=300)[0]
    print("| bytes per rank | call | ms (median of 100, synchronised) |")
    print("|---|---|---|")
    for size, name, ms in rows:
        print(f"| {size} | {name} | {ms:.3f} |")


def _two(rank, world_size):
    torch.cuda.set_device(0)
    inp = torch.full((1000,), float(rank + 1), device="cuda")
    out = torch.empty(2000, device="cuda")
    dist.all_gather_into_tensor(out, inp)
    torch.cuda.synchronize()
    native = out.clone()
    results = {"native": native[::1000].tolist()}
    for spec, algorithm in (("none", "ring"), ("int8", "ring"), ("int8", "backend")):
        mine = torch.empty_like(out)
        cp.all_gather_into_tensor(mine, inp, codec=spec, algorithm=algorithm)
        torch.cuda.synchronize()
        results[f"{spec}@{algorithm}"] = bool(torch.equal(mine, native))
    return results


def two_ranks():
    """Two NCCL ranks on one GPU: NCCL refuses a duplicate GPU in most versions."""
    try:
        print(run_distributed(_two, 2, backend="nccl", timeout=60))
    except Exception as error:  # noqa: BLE001 - report whatever NCCL says
        print(f"two NCCL ranks on one GPU: {type(error).__name__}: {str(error)[-1500:]}")


if __name__ == "__main__":
    {"codecs": codecs, "fixed": fixed, "two_ranks": two_ranks}[sys.argv[1]]()
