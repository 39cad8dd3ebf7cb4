"""A pytest plugin: each test's CPU seconds, every process of the run counted (the ranks
that a fork server starts too, which ``time`` misses: they are not pytest's children), and
its wall seconds, one JSON line per test ``[nodeid, cpu_s, wall_s]``.

Run pytest inside a cpuacct cgroup of its own (``cpu_of.sh``), with this folder on
``PYTHONPATH``: ``PYTHONPATH=benchmarks/test_suite_2026-12-07 CPU_PER_TEST_OUT=rows.jsonl
bash benchmarks/test_suite_2026-12-07/cpu_of.sh python -m pytest -p cpu_per_test``.
"""

from __future__ import annotations

import json
import os
import time

import pytest


def _usage_file() -> str:
    """The cpuacct usage (ns) of this process's cgroup: cgroup v1, as on our VMs."""
    with open("/proc/self/cgroup") as cgroups:
        for line in cgroups:
            _, controllers, path = line.strip().split(":", 2)
            if "cpuacct" in controllers.split(","):
                return f"/sys/fs/cgroup/cpuacct{path}/cpuacct.usage"
    raise RuntimeError("no cpuacct cgroup (cgroup v1) for this process")


def _cpu_ns(path: str) -> int:
    with open(path) as usage:
        return int(usage.read())


_USAGE = _usage_file()
_ROWS = open(os.environ.get("CPU_PER_TEST_OUT", "cpu_per_test.jsonl"), "w")  # noqa: SIM115


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu_ns(_USAGE), time.perf_counter()
    yield
    row = [item.nodeid, (_cpu_ns(_USAGE) - cpu) / 1e9, time.perf_counter() - wall]
    _ROWS.write(json.dumps(row) + "\n")
    _ROWS.flush()
