"""Which part of the in-band argument check costs what, on the emulated cluster.

``python benchmarks/check_overlap_2026-11-25/check_parts.py HOSTS ITERS SIZE OP VARIANT,...``
(root; OP ``all_gather`` or ``reduce_scatter``; int8 ``ring``; HOSTS hosts at 1 Gbit/s,
prefix ``cppt``). Variants, interleaved call by call, their order rotated each round:

* ``check``: the library as it is;
* ``check-nohold``: the all-gather writes ``out`` as it goes instead of at the end (not
  safe: what the hold buys is that a mismatch leaves ``out`` untouched);
* ``check-noheaders``: the header is neither written nor read (not safe: no check at all,
  but every other part of the in-band path runs);
* ``check-nohold-noheaders``: both;
* ``check-early``, ``check-noearly``: the all-gather takes the early verdict from 1 MiB
  on any number of ranks, or never (``executor.EARLY_VERDICT_BYTES``,
  ``EARLY_VERDICT_MIN_RANKS``);
* ``check-split``, ``check-nosplit``: the all-gather sends its last header alone at any
  size, or at none (``executor.SPLIT_LAST_BYTES``);
* ``check-ahead``: the checked ring posts its second receive as soon as its first message
  is posted, as the unchecked ring does, not once the left neighbour's first header has
  agreed (not safe: a larger message from a neighbour that disagrees ends the process);
* ``nocheck``, ``nocheck-again``: no fingerprint (the second is the A/A yardstick);
* ``nocheck-late``: no fingerprint, and the ring posts its second receive only once the
  first has arrived, as the checked ring must (the others it posts a step ahead as usual).

Prints each variant's median and its paired difference from ``nocheck`` with a 95%
bootstrap interval (``commpress.bench.paired``).
"""

from __future__ import annotations

import statistics
import sys

from commpress.bench.paired import interleaved_rounds, paired_difference
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.collectives import executor, inband, payloads

WARMUP = 3


def _unsafe(name: str):
    """Patch in what the variant's suffixes switch off; returns the undo."""
    undo = []
    if "nohold" in name:
        hold = payloads.Gathered.hold
        payloads.Gathered.hold = lambda self: None
        undo.append(lambda: setattr(payloads.Gathered, "hold", hold))
    if "noheaders" in name:
        saved = {n: getattr(inband.Check, n) for n in ("stamp", "note", "accept_first")}
        inband.Check.stamp = lambda self, message, following: None
        inband.Check.note = lambda self, message: None
        inband.Check.accept_first = lambda self, scratch, into=None: None
        undo.append(lambda: [setattr(inband.Check, n, f) for n, f in saved.items()])
    for suffix, threshold in (("noearly", 1 << 60), ("early", 1 << 20)):
        if suffix in name:
            early = executor.EARLY_VERDICT_BYTES, executor.EARLY_VERDICT_MIN_RANKS
            executor.EARLY_VERDICT_BYTES, executor.EARLY_VERDICT_MIN_RANKS = threshold, 0

            def undo_early(early=early):
                executor.EARLY_VERDICT_BYTES, executor.EARLY_VERDICT_MIN_RANKS = early

            undo.append(undo_early)
            break
    for suffix, threshold in (("nosplit", 1 << 60), ("split", 1)):
        if suffix in name:
            split = executor.SPLIT_LAST_BYTES
            executor.SPLIT_LAST_BYTES = threshold
            undo.append(lambda split=split: setattr(executor, "SPLIT_LAST_BYTES", split))
            break
    if "ahead" in name:
        first = executor._FirstMessage

        class AgreedAtOnce(first):
            def __init__(self, check, message, scratch, into, agreed):
                super().__init__(check, message, scratch, into, lambda: None)
                agreed()

        executor._FirstMessage = AgreedAtOnce
        undo.append(lambda: setattr(executor, "_FirstMessage", first))
    if "late" in name:
        receives_ahead = executor._ReceivesAhead
        executor._ReceivesAhead = _SecondReceiveLate
        undo.append(lambda: setattr(executor, "_ReceivesAhead", receives_ahead))
    return lambda: [step() for step in undo]


class _SecondReceiveLate(executor._ReceivesAhead):
    """The receives of a chain posted ahead, but the second only once the first has
    arrived (what the checked ring must do)."""

    _first_arrived = False

    def post(self, k: int) -> None:
        if k != 1 or self._first_arrived:
            super().post(k)

    def take(self, k: int):
        into, parts = super().take(k)
        if k != 0:
            return into, parts
        ahead, (received,) = self, parts

        class ThenPostSecond:
            def wait(self, timeout=None):
                received.wait(timeout)
                ahead._first_arrived = True
                ahead.post(1)

        return into, [ThenPostSecond()]


def worker(rank, world_size, size, iterations, op, variants):
    import check_cost

    call = check_cost._call(op, size, world_size, "ring")

    def switch(variant: str):
        undo_check = check_cost._variant(variant.split("-")[0])
        undo_parts = _unsafe(variant)
        return lambda: (undo_parts(), undo_check())

    return interleaved_rounds(call, variants, iterations, switch, WARMUP)


def main() -> None:

    hosts, iterations, size = (int(a) for a in sys.argv[1:4])
    op, variants = sys.argv[4], sys.argv[5].split(",")
    with cluster_for(hosts, "1gbit", prefix="cppt") as cluster:
        times = cluster.run(worker, size, iterations, op, variants, timeout=1800)[0]
    print(f"{hosts} hosts at 1 Gbit/s, int8 ring {op}, {size} B, {iterations} rounds (ms)")
    for variant in variants:
        line = f"| {variant} | {statistics.median(times[variant]) * 1e3:.2f} |"
        if variant != "nocheck":
            middle, low, high = paired_difference(times[variant], times["nocheck"])
            line += f" {middle * 1e3:+.2f} ({low * 1e3:+.2f} to {high * 1e3:+.2f}) |"
        print(line)


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
