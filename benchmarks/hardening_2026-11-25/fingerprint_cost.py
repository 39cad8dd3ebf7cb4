"""What the argument fingerprint costs each compressed collective.

Every compressed collective all-gathers a 128-byte fingerprint of its arguments
(``commpress.collectives.fingerprint.Agreement``), overlapped with its first encode. This
script times, in one process group, the int8 ring all-gather and reduce-scatter with the
check (as shipped) and with ``Agreement`` replaced by a no-op, interleaved call by call so
that both see the same machine state; and the fingerprint exchange alone, not overlapped.
Medians over ITERATIONS, slowest rank.

    python benchmarks/hardening_2026-11-25/fingerprint_cost.py [WORLD] [ITERATIONS]

On the emulated cluster: ``commpress launch --hosts 4 --link 1gbit -- python THIS 0 20``
(WORLD 0: take the launcher's process group from the environment).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.collectives import fingerprint

SIZES = [64 << 10, 1 << 20, 4 << 20, 16 << 20]  # bytes of the all-gather output (fp32)
CHECKED = fingerprint.Agreement


class _NoCheck:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def check(self) -> None:
        pass


def _timed(call) -> float:
    dist.barrier()
    start = time.perf_counter()
    call()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def _measure(rank, world_size, iterations):
    from commpress.collectives import all_gather, reduce_scatter

    rows = []
    for size in SIZES:
        numel = size // 4 // world_size
        inp, out = torch.randn(numel), torch.empty(numel * world_size)
        big = torch.randn(numel * world_size)
        calls = {
            "all_gather": lambda out=out, inp=inp: cp.all_gather_into_tensor(out, inp),
            "reduce_scatter": lambda inp=inp, big=big: cp.reduce_scatter_tensor(inp, big),
        }
        for op, call in calls.items():
            call()  # warm up: buffers, kernels
            times = {"checked": [], "unchecked": []}
            for _ in range(iterations):
                for variant, agreement in (("checked", CHECKED), ("unchecked", _NoCheck)):
                    all_gather.Agreement = reduce_scatter.Agreement = agreement
                    times[variant].append(_timed(call))
            all_gather.Agreement = reduce_scatter.Agreement = CHECKED
            checked = statistics.median(times["checked"])
            unchecked = statistics.median(times["unchecked"])
            rows.append((op, size, checked * 1e6, unchecked * 1e6, checked / unchecked - 1))
    mine = fingerprint.Fingerprint.of("all_gather", torch.zeros(1), cp.get_codec("int8"), "ring")
    alone = statistics.median(
        _timed(lambda: fingerprint.agree(None, mine, None, torch.device("cpu")))
        for _ in range(iterations)
    )
    return rows, alone * 1e6


def main() -> None:
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    if world == 0:  # launched by `commpress launch`: one rank per emulated host
        dist.init_process_group("gloo")
        rows, alone = _measure(dist.get_rank(), dist.get_world_size(), iterations)
        if dist.get_rank() != 0:
            return
    else:
        rows, alone = run_distributed(_measure, world, iterations, timeout=1800)[0]
    print("| op | size (B) | with check (us) | without (us) | cost |")
    print("|---|---:|---:|---:|---:|")
    for op, size, checked, unchecked, cost in rows:
        print(f"| {op} | {size} | {checked:.0f} | {unchecked:.0f} | {cost:+.1%} |")
    print(f"\nfingerprint exchange alone: {alone:.0f} us (median)")


if __name__ == "__main__":
    main()
