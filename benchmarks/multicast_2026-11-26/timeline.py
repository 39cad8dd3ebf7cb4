"""Per-rank timeline of one all-gather on an emulated cluster of 8 hosts in 2 racks (hosts
1 Gbit/s, uplinks 500 Mbit/s): when each rank's argument check ends, when its broadcasts
are posted, when each root's payload is complete there, and each thread's CPU per call.

An investigation tool: it wraps private methods (``Check.settle``, ``Engine.post``,
``Operation._finish``) to mark those events; every rank shares the machine's monotonic
clock, so times are comparable across ranks.

    [MTU=1500] python benchmarks/multicast_2026-11-26/timeline.py SIZE ALGORITHM CODEC
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

from commpress.cluster.jobs import main_of_script

CALLS, WARM_UP = 12, 2
HOSTS = 8


def _thread_ticks() -> dict[str, int]:
    """CPU clock ticks (user + system) of each thread of this process, by name."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    ticks = {}
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/stat") as file:
            stat = file.read()
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks[f"{names.get(int(task), 'other')}:{task}"] = int(fields[11]) + int(fields[12])
    return ticks


def _mark_events(events: list) -> None:
    from commpress.collectives import inband
    from commpress.transport import reliable_broadcast

    def mark(name: str) -> None:
        events.append((name, time.monotonic()))

    settle, post, finish = (
        inband.Check.settle,
        reliable_broadcast.Engine.post,
        reliable_broadcast.Operation._finish,
    )

    def settled(self):
        settle(self)
        mark("check done")

    def posted(self, operation):
        mark("broadcasts posted")
        post(self, operation)

    def finished(self, root):
        if not self._done[root].is_set():
            mark(f"root {root} here")
        finish(self, root)

    inband.Check.settle = settled
    reliable_broadcast.Engine.post = posted
    reliable_broadcast.Operation._finish = finished
    return mark


def _worker(rank, world_size, size, options, algorithm, codec_name):
    from commpress.codecs import get_codec
    from commpress.collectives.all_gather import gather
    from commpress.collectives.fingerprint import Fingerprint
    from commpress.transport import multicast

    multicast.configure(None, multicast.Options(**options))
    events: list = []
    mark = _mark_events(events)
    codec = get_codec(codec_name)
    shard = size // 4 // world_size
    inp, out = torch.randn(shard), torch.empty(shard * world_size)
    fingerprint = Fingerprint.of("all_gather", inp, codec, algorithm)
    calls, cpu = [], []
    for call in range(WARM_UP + CALLS):
        if call == WARM_UP:
            ticks_before = _thread_ticks()
        dist.barrier()
        events.clear()
        start_cpu = time.process_time()
        mark("start")
        gather(out, inp, None, codec, algorithm, None, fingerprint)
        mark("end")
        if call >= WARM_UP:
            calls.append(dict(events))
            cpu.append((time.process_time() - start_cpu) * 1e3)
    ticks = _thread_ticks()
    per_thread = {
        name: (count - ticks_before.get(name, 0)) / os.sysconf("SC_CLK_TCK") * 1e3 / CALLS
        for name, count in ticks.items()
        if count > ticks_before.get(name, 0)
    }
    everything = [None] * world_size
    dist.all_gather_object(everything, (calls, statistics.median(cpu), per_thread))
    return everything if rank == 0 else None


def main() -> None:
    from commpress.cluster import Emulated
    from commpress.cluster.commands import multicast_options

    size, algorithm, codec = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    mtu = int(os.environ.get("MTU", 9000))
    with Emulated(
        HOSTS, "1gbit", racks=2, uplink="500mbit", mtu=mtu, prefix="mct"
    ) as cluster:  # fmt: skip
        ranks = cluster.run(_worker, size, multicast_options(cluster), algorithm, codec,
                            timeout=900)[0]  # fmt: skip
        where = cluster.describe()
    print(f"# {algorithm} {codec} all-gather of {size} B, {where}: medians of {CALLS} calls")
    starts = [min(calls[i]["start"] for calls, _, _ in ranks) for i in range(CALLS)]
    names = sorted(
        {name for calls, _, _ in ranks for name in calls[0]},
        key=lambda name: (
            statistics.median(c[name] for c in ranks[0][0] if name in c)
            if name in ranks[0][0][0]
            else 0
        ),
    )
    print(
        "ms after the first rank's start".ljust(34)
        + "".join(f"r{r}".rjust(8) for r in range(HOSTS))
    )
    for name in names:
        cells = []
        for calls, _, _ in ranks:
            times = [(c[name] - starts[i]) * 1e3 for i, c in enumerate(calls) if name in c]
            cells.append(f"{statistics.median(times):8.2f}" if times else "       -")
        print(name.ljust(34) + "".join(cells))
    print("process CPU per call, ms".ljust(34) + "".join(f"{cpu:8.1f}" for _, cpu, _ in ranks))
    ends = [max(calls[i]["end"] for calls, _, _ in ranks) - starts[i] for i in range(CALLS)]
    print(f"slowest rank's end, ms: median {statistics.median(ends) * 1e3:.1f}, all "
          f"{sorted(round(end * 1e3, 1) for end in ends)}")  # fmt: skip
    for rank, (_, _, per_thread) in enumerate(ranks):
        threads = ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(per_thread.items()))
        print(f"rank {rank}, CPU per call by thread (ms; clock ticks of 10 ms): {threads}")


if __name__ == "__main__":  # run from the module, so that the ranks can import _worker
    sys.exit(main_of_script(__file__))
