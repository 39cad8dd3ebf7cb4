"""When each part of a checked and an unchecked int8 ring call happens, rank by rank.

``python benchmarks/check_overlap_2026-11-25/timeline.py HOSTS ROUNDS SIZE OP`` (root; OP
``all_gather`` or ``reduce_scatter``; HOSTS hosts at 1 Gbit/s, prefix ``cptl``). Each round
runs the call with the check and without (``check_cost.py``'s ``check`` and ``nocheck``),
in alternating order, each from a barrier; every rank records, in ms from its own start of
the call: the encode of its own payloads (``enc0``, ``enc1``), each send and receive posted
(``post s0``, ``post r0``, ...) and waited (``done s0``, ...), and the held decodes written
to the output (``rel0``, ``rel1``: the all-gather with the check only). Prints, per rank and
variant, the median of each event over the rounds after three warm-up rounds. Times are
comparable within a rank only: the barrier releases the ranks up to a few ms apart.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch.distributed as dist

from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.collectives import executor, payloads
from commpress.transport import p2p

WARMUP = 3


class _Recorder:
    """Patches the transport, the encode and the release to append ``(event, seconds)``."""

    def __init__(self):
        self.events: list[tuple[str, float]] = []
        self._names: dict[int, str] = {}
        self._counts = {"s": 0, "r": 0}
        post_each, wait = p2p.post_each, p2p.wait
        encode_own, release = executor._encode_own, payloads.Gathered.release

        def posting(group, sends, receives):
            works = post_each(group, sends, receives)
            kinds = ["r"] * len(receives) + ["s"] * len(sends)  # as post_each posts them
            for kind, work in zip(kinds, works, strict=True):
                self._names[id(work)] = f"{kind}{self._counts[kind]}"
                self._counts[kind] += 1
                self._note(f"post {self._names[id(work)]}")
            return works

        def waiting(work, timeout):
            result = wait(work, timeout)
            if id(work) in self._names:
                self._note(f"done {self._names[id(work)]}")
            return result

        def encoding(schedule, payloads_):
            self._note("enc0")
            encode_own(schedule, payloads_)
            self._note("enc1")

        def releasing(gathered):
            self._note("rel0")
            release(gathered)
            self._note("rel1")

        p2p.post_each, p2p.wait = posting, waiting
        executor._encode_own, payloads.Gathered.release = encoding, releasing

    def _note(self, event: str) -> None:
        self.events.append((event, time.perf_counter()))

    def clear(self) -> None:
        self.events.clear()
        self._names.clear()
        self._counts = {"s": 0, "r": 0}


def worker(rank, world_size, size, rounds, op):
    import check_cost

    call = check_cost._call(op, size, world_size, "ring")
    recorder = _Recorder()
    runs: dict[str, list[dict[str, float]]] = {"check": [], "nocheck": []}
    for index in range(rounds):
        for variant in ("check", "nocheck") if index % 2 else ("nocheck", "check"):
            undo = check_cost._variant(variant)
            dist.barrier()
            recorder.clear()
            start = time.perf_counter()
            call()
            end = time.perf_counter()
            undo()
            if index >= WARMUP:
                events = {}  # the first occurrence of each (a release can come twice)
                for name, t in recorder.events:
                    events.setdefault(name, (t - start) * 1e3)
                runs[variant].append({**events, "end": (end - start) * 1e3})
    return runs


def main() -> None:
    hosts, rounds, size, op = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with cluster_for(hosts, "1gbit", prefix="cptl") as cluster:
        results = cluster.run(worker, size, rounds, op, timeout=1800)
    print(f"{hosts} hosts at 1 Gbit/s, int8 ring {op}, {size} B, {rounds - WARMUP} rounds")
    print("ms from the rank's own start of the call, median over rounds")
    for rank, runs in enumerate(results):
        for variant, calls in runs.items():
            order = sorted(calls[0], key=calls[0].get)
            medians = {e: statistics.median(c[e] for c in calls if e in c) for e in order}
            line = "  ".join(f"{event}={medians[event]:.2f}" for event in order)
            print(f"rank {rank} {variant:8s} {line}")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
