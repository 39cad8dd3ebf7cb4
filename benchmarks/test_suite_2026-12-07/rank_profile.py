"""CPU seconds and cProfile of one rank of a 2-rank test function, forked from the fork
server as the tests' ranks are, with or without the tests' preloads.

``python benchmarks/test_suite_2026-12-07/rank_profile.py [--no-preload] MODULE:FUNCTION [ARGS]``
(ARGS: a Python literal tuple), from the repository's root; the second of two runs is
reported (the first starts the server)."""

from __future__ import annotations

import cProfile
import importlib
import io
import pstats
import sys
import time

from commpress.cluster.local import run_distributed


def profiled(rank, world_size, name, *args):
    module, function = name.rsplit(":", 1)
    test = getattr(importlib.import_module(module), function)
    profile, cpu = cProfile.Profile(), time.process_time()
    profile.enable()
    test(rank, world_size, *args)
    profile.disable()
    cpu = time.process_time() - cpu
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
    return cpu, text.getvalue()


def main(argv: list[str]) -> None:
    preloaded = argv[0] != "--no-preload"
    argv = argv if preloaded else argv[1:]
    name, args = argv[0], (eval(argv[1]) if len(argv) > 1 else ())  # noqa: S307 - our own
    sys.path.insert(0, ".")
    if preloaded:
        import tests.conftest  # noqa: F401 - its preloads
    run_distributed(profiled, 2, name, *args)
    results = run_distributed(profiled, 2, name, *args)
    print(f"{name}, preloads {'of tests/conftest.py' if preloaded else 'none'}")
    print("CPU seconds per rank:", [round(cpu, 2) for cpu, _ in results])
    print(results[0][1])


if __name__ == "__main__":
    main(sys.argv[1:])
