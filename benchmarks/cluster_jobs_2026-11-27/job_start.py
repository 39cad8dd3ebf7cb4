"""What a job on the emulated cluster costs before ``fn`` runs: ``cluster.run`` of a
function that returns at once, JOBS times in a row on one cluster of HOSTS hosts.

``python benchmarks/cluster_jobs_2026-11-27/job_start.py HOSTS JOBS`` (root; prefix
``cpjs``). Prints each job's wall time in seconds; the first includes starting the fork
server where the library uses one.
"""

from __future__ import annotations

import sys
import time

from commpress.cluster import Emulated


def _nothing(rank: int, world_size: int) -> int:
    return rank


def main(hosts: int, jobs: int) -> None:
    with Emulated(hosts, "1gbit", prefix="cpjs") as cluster:
        for job in range(jobs):
            start = time.monotonic()
            assert cluster.run(_nothing) == list(range(hosts))
            print(f"job {job}: {time.monotonic() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
