"""What a one-GPU machine can tell that the first GPU session did not.

Usage: python probe.py gloo_cuda|codec_calls|decode_bits|profile  (prints markdown)

- ``gloo_cuda``: two ranks sharing the one GPU on a gloo group (NCCL refuses two ranks on
  one device), CUDA tensors, every algorithm and op with hops between the ranks. Each
  result is compared bit for bit with the same commpress call on CPU copies of the same
  inputs in the same processes, and with the exact sum (float64) for its error.
- ``codec_calls``: the cost of one encode and one decode on CUDA at small and large sizes,
  synchronised (GPU time included) and launched back to back (the CPU's cost per call).
- ``decode_bits``: whether the codecs' encode and decode on CUDA give the CPU's bits
  (16 Mi elements), and whether the division ``q / qmax`` alone explains a difference.
- ``profile``: where the CPU time of a one-rank int8 all-gather on NCCL goes
  (torch.profiler, every thread).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import timedelta

import torch

import commpress as cp
from commpress.cluster.local import run_distributed

SHARD = 1 << 16
CASE_TIMEOUT = timedelta(seconds=20)
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")  # "cpu": a dry run of the script
OPS_OF = {
    "ring": ("all_gather", "reduce_scatter", "all_reduce"),
    "ring-hop": ("all_gather", "reduce_scatter", "all_reduce"),
    "alltoall": ("reduce_scatter", "all_reduce"),
    "backend": ("all_gather", "reduce_scatter", "all_reduce"),
}
CODECS = (("none", torch.float32), ("int8", torch.float32), ("int4", torch.float32),
          ("none", torch.bfloat16), ("int8", torch.bfloat16))  # fmt: skip


def _inputs(op: str, world_size: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every rank's input, the same on every rank (seeded)."""
    numel = SHARD if op == "all_gather" else SHARD * world_size
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(numel, generator=generator).to(dtype) for _ in range(world_size)]


def _exact(op: str, inputs: list[torch.Tensor], rank: int, world_size: int) -> torch.Tensor:
    if op == "all_gather":
        return torch.cat(inputs).double()
    total = torch.stack([x.double() for x in inputs]).sum(0)
    return total.chunk(world_size)[rank] if op == "reduce_scatter" else total


def _call(op: str, inp: torch.Tensor, world_size: int, spec: str, algorithm: str):
    """Run the collective on a copy of ``inp``; its output."""
    kwargs = {"codec": spec, "algorithm": algorithm, "timeout": CASE_TIMEOUT}
    if op == "all_gather":
        out = inp.new_empty(inp.numel() * world_size)
        cp.all_gather_into_tensor(out, inp, **kwargs)
    elif op == "reduce_scatter":
        out = inp.new_empty(inp.numel() // world_size)
        cp.reduce_scatter_tensor(out, inp, **kwargs)
    else:
        out = inp.clone()
        cp.all_reduce(out, **kwargs)
    return out


def _gloo_cuda(rank: int, world_size: int, algorithm: str) -> list[tuple]:
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
    rows = []
    for op in OPS_OF[algorithm]:
        for spec, dtype in CODECS:
            inputs = _inputs(op, world_size, dtype)
            name = str(dtype).removeprefix("torch.")
            try:
                on_gpu = _call(op, inputs[rank].to(DEVICE), world_size, spec, algorithm)
                on_cpu = _call(op, inputs[rank], world_size, spec, algorithm)
                seen = on_gpu.cpu()
                exact = _exact(op, inputs, rank, world_size)
                error = float((seen.double() - exact).abs().max() / exact.abs().max())
                digest = int(seen.view(torch.int16 if seen.element_size() == 2 else torch.int32)
                             .long().sum())  # fmt: skip
                rows.append((op, spec, name, torch.equal(seen, on_cpu), error, digest, ""))
            except Exception as error:  # noqa: BLE001 - report what each case raised
                rows.append((op, spec, name, False, float("nan"), 0, repr(error)[:300]))
    return rows


def gloo_cuda() -> None:
    print("| algorithm | op | codec | dtype | CUDA == CPU (both ranks) | max rel. error | "
          "ranks' outputs identical | error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for algorithm in OPS_OF:
        try:
            ranks = run_distributed(_gloo_cuda, 2, algorithm, backend="gloo", timeout=240)
        except Exception as error:  # noqa: BLE001 - a rank that dies fails the algorithm
            print(f"| {algorithm} | - | - | - | - | - | - | {str(error)[-600:]!r} |")
            continue
        for zero, one in zip(*ranks, strict=True):
            op, spec, dtype, equal0, error0, digest0, raised0 = zero
            equal1, error1, digest1, raised1 = one[3], one[4], one[5], one[6]
            same = "yes" if digest0 == digest1 else "no"
            if op != "all_gather":
                same = "-"  # each rank ends with its own chunk (reduce-scatter)
            raised = raised0 or raised1
            print(f"| {algorithm} | {op} | {spec} | {dtype} | {equal0 and equal1} | "
                  f"{max(error0, error1):.2e} | {same} | {raised} |")  # fmt: skip
        sys.stdout.flush()


def _median_ms(fn, repeats: int, synchronise: bool) -> float:
    """Median ms of ``fn`` synchronised around each call, or, unsynchronised, the mean over
    ``repeats`` calls launched back to back (the CPU's cost while the GPU keeps up)."""
    if not synchronise:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        return elapsed / repeats * 1e3
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def codec_calls() -> None:
    print("| codec | elements | encode ms (sync) | decode ms (sync) | encode ms (CPU, back to "
          "back) | decode ms (CPU, back to back) | clone ms (sync) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for numel in (4096, 1 << 20, 1 << 24):
        x = torch.randn(numel, device="cuda")
        clone = _median_ms(x.clone, 50, True)
        for spec in ("none", "int8", "int4", "fp8"):
            codec = cp.get_codec(spec)
            payload = codec.encode(x)
            codec.decode(payload, numel, x.dtype)

            def encode(codec=codec, x=x):
                return codec.encode(x)

            def decode(codec=codec, payload=payload, numel=numel):
                return codec.decode(payload, numel, torch.float32)

            times = [_median_ms(f, 100, s) for s in (True, False) for f in (encode, decode)]
            cells = " | ".join(f"{t:.3f}" for t in (times[0], times[1], times[2], times[3]))
            print(f"| {spec} | {numel} | {cells} | {clone:.3f} |")
    sys.stdout.flush()


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between two finite fp32 tensors."""
    return int((a.view(torch.int32).long() - b.view(torch.int32).long()).abs().max())


def decode_bits() -> None:
    numel = 1 << 24
    x = torch.randn(numel, generator=torch.Generator().manual_seed(3)) * 10
    print("| codec | encode: bytes differing of | decode: elements differing | max ulps |")
    print("|---|---|---|---|")
    for spec in ("int8", "int4", "fp8"):
        codec = cp.get_codec(spec)
        on_cpu = codec.encode(x)
        on_gpu = codec.encode(x.cuda()).cpu()
        differing = int((on_cpu != on_gpu).sum())
        decoded_cpu = codec.decode(on_cpu, numel, torch.float32)
        decoded_gpu = codec.decode(on_cpu.cuda(), numel, torch.float32).cpu()
        wrong = int((decoded_cpu != decoded_gpu).sum())
        ulps = _ulps(decoded_cpu, decoded_gpu)
        print(f"| {spec} | {differing} of {on_cpu.numel()} | {wrong} of {numel} | {ulps} |")
    q = torch.arange(-127, 128, dtype=torch.float32)
    eager = (q.cuda() / 127.0).cpu()
    compiled = torch.compile(lambda t: t / 127.0)(q.cuda()).cpu()
    exact = q / 127.0
    print(f"q / 127 for every int8 code, of 255: CUDA eager differs from the CPU in "
          f"{int((exact != eager).sum())}, CUDA compiled (inductor) in "
          f"{int((exact != compiled).sum())} (max ulps {_ulps(exact, compiled)})")  # fmt: skip
    sys.stdout.flush()


def _profile(rank: int, world_size: int) -> str:
    torch.cuda.set_device(0)
    inp = torch.randn(1024, device="cuda")
    out = torch.empty(1024 * world_size, device="cuda")

    def call():
        cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="ring")

    for _ in range(20):
        call()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(50):
            call()
        torch.cuda.synchronize()
    return profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)


def profile() -> None:
    print("one-rank NCCL group, int8@ring all-gather of 4 KiB, 50 calls:")
    print(run_distributed(_profile, 1, backend="nccl", timeout=240)[0])


if __name__ == "__main__":
    {
        "gloo_cuda": gloo_cuda,
        "codec_calls": codec_calls,
        "decode_bits": decode_bits,
        "profile": profile,
    }[sys.argv[1]]()
