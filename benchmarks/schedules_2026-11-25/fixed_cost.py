"""Where the fixed cost of a small compressed all-gather goes, on the emulated cluster.

``python benchmarks/schedules_2026-11-25/fixed_cost.py HOSTS SIZE ITERS VARIANT...``
(root; builds HOSTS hosts at 1 Gbit/s, prefix ``cpfc``). A variant is
``ALGORITHM:CODEC[:late][:nocheck][:p2pcheck]``: ``late`` waits for the argument check
before the first send (the order before the single executor), ``nocheck`` skips the check,
``p2pcheck`` exchanges whole fingerprints with every peer as the check did before it
became an all-reduce of digests. Variants
run interleaved, one call each per round, so drift hits all alike. Per variant: the median
over calls of the slowest rank's time, and the median time per call each rank spent in each
part on the communication thread (argument check, encode, decode, posting and waiting for
transfers), measured by wrapping those functions in timers.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.collectives import all_gather, executor, fingerprint
from commpress.collectives.fingerprint import Agreement
from commpress.transport import collective, p2p

PARTS: collections.defaultdict = collections.defaultdict(float)
WARMUP = 3


def _timed(name, function):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            PARTS[name] += time.perf_counter() - start

    return wrapper


class _TimedBatch:
    real = p2p.Batch

    def __init__(self, *args):
        start = time.perf_counter()
        self._batch = self.real(*args)
        PARTS["post transfers"] += time.perf_counter() - start

    def wait(self, timeout=None):
        start = time.perf_counter()
        self._batch.wait(timeout)
        PARTS["wait transfers"] += time.perf_counter() - start


def _instrument() -> None:
    p2p.Batch = fingerprint.Batch = _TimedBatch
    collective.all_gather = _timed("backend all-gather (post)", collective.all_gather)
    fingerprint.Agreement.check = _timed("argument check (wait)", fingerprint.Agreement.check)
    for name in ("int8", "int4"):
        codec = cp.get_codec(name)
        object.__setattr__(codec, "encode", _timed("encode", codec.encode))
        object.__setattr__(codec, "decode", _timed("decode", codec.decode))


class _PointToPointCheck(Agreement):
    """The check up to commit 359d15a: every rank's whole fingerprint to every other rank
    in one round of point-to-point messages (the success path only)."""

    def __init__(self, group, mine, timeout, device, early=None):
        self._group, self._timeout = group or dist.group.WORLD, timeout
        rank, world_size = dist.get_rank(self._group), dist.get_world_size(self._group)
        local = torch.frombuffer(bytearray(mine.to_bytes(0)), dtype=torch.uint8)
        self._rows = torch.empty(world_size, local.numel(), dtype=torch.uint8)
        peers = [peer for peer in range(world_size) if peer != rank]
        sends = [(local, peer) for peer in peers]
        self._batch = p2p.Batch(self._group, sends, [(self._rows[p], p) for p in peers])

    def check(self):
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.wait(self._timeout)

    def sent_early(self, sends):
        pass


def _with_toggles(toggles: list[str]):
    real_execute, real_init = all_gather.execute, fingerprint.Agreement.__init__

    def late(schedule, payloads, group, timeout, fingerprint=None, window=None):
        if fingerprint is not None:
            Agreement(group, fingerprint, timeout, payloads.device).check()
        real_execute(schedule, payloads, group, timeout, None, window)

    def skipped(self, *args, **kwargs):
        self._batch = None

    if "late" in toggles:
        all_gather.execute = late
    if "nocheck" in toggles:
        fingerprint.Agreement.__init__ = skipped
    executor_agreement = executor.Agreement
    if "p2pcheck" in toggles:
        executor.Agreement = _PointToPointCheck

    def restore():
        all_gather.execute, fingerprint.Agreement.__init__ = real_execute, real_init
        executor.Agreement = executor_agreement

    return restore


def worker(rank, world_size, size, iterations, variants):
    _instrument()
    numel = size // 4 // world_size
    inp = torch.randn(numel)
    out = torch.empty(numel * world_size)
    calls = {v: [] for v in variants}
    parts = {v: [] for v in variants}
    for index in range(WARMUP + iterations):
        for variant in variants:
            algorithm, codec, *toggles = variant.split(":")
            restore = _with_toggles(toggles)
            PARTS.clear()
            dist.barrier()
            start = time.perf_counter()
            cp.all_gather_into_tensor(out, inp, codec=codec, algorithm=algorithm)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            restore()
            mine = dict(PARTS)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if index >= WARMUP:
                calls[variant].append(elapsed.item())
                parts[variant].append(mine)
    rows = []
    for variant in variants:
        names = sorted({name for p in parts[variant] for name in p})
        breakdown = {n: statistics.median(p.get(n, 0.0) for p in parts[variant]) for n in names}
        rows.append((variant, statistics.median(calls[variant]), breakdown))
    return rows


def main() -> None:
    hosts, size, iterations = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    variants = sys.argv[4:]
    with cluster_for(hosts, "1gbit", prefix="cpfc") as cluster:
        by_rank = cluster.run(worker, size, iterations, variants, timeout=900)
    print(f"{hosts} hosts, {size} B all-gather, median of {iterations} interleaved calls")
    for position, (variant, call, _) in enumerate(by_rank[0]):
        print(f"\n{variant}: {call * 1e3:.2f} ms per call (slowest rank); per rank, ms:")
        for rank, rows in enumerate(by_rank):
            parts = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in rows[position][2].items())
            print(f"  rank {rank}: {parts}")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
