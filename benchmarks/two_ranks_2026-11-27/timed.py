"""The timing loop both scripts here share."""

import time

import torch.distributed as dist


def print_times(name: str, call, ideal_ms: float, calls: int = 6) -> None:
    """One untimed call, then ``calls`` timed ones between barriers; rank 0 prints ms."""
    call()
    times = []
    for _ in range(calls):
        dist.barrier()
        start = time.perf_counter()
        call()
        dist.barrier()
        times.append((time.perf_counter() - start) * 1e3)
    if dist.get_rank() == 0:
        print(f"{name:14s}", " ".join(f"{t:6.1f}" for t in times), f"ideal {ideal_ms:.1f}")
