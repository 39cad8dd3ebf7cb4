"""Seconds to start: ``import commpress``, ``commpress --help``, and ``run_distributed`` of
a trivial 4-rank function (one all-reduce of 4 floats), three calls in one process.

``PYTHONPATH=SRC python benchmarks/test_suite_2026-11-27/startup.py`` with SRC the
``src`` folder of the commit to time (a worktree for an older one). Wall-clock seconds of
each of three runs; nothing else should run meanwhile.
"""

from __future__ import annotations

import subprocess
import sys
import time


def _all_reduce(rank, world_size):
    import torch
    import torch.distributed as dist

    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    return float(tensor[0])


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    for label, command in (
        ("import commpress", [sys.executable, "-c", "import commpress"]),
        ("commpress --help", [sys.executable, "-m", "commpress.cli", "--help"]),
    ):
        runs = [_seconds(command) for _ in range(3)]
        print(f"{label}: " + " ".join(f"{seconds:.2f}" for seconds in runs) + " s")
    from commpress.cluster.local import run_distributed

    runs = []
    for _ in range(3):
        start = time.perf_counter()
        assert run_distributed(_all_reduce, 4) == [4.0] * 4
        runs.append(time.perf_counter() - start)
    print("run_distributed, 4 ranks: " + " ".join(f"{seconds:.2f}" for seconds in runs) + " s")


if __name__ == "__main__":
    main()
