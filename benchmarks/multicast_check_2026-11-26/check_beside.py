"""The multicast all-gather with its argument check before the broadcasts and beside them,
and the ring, paired in one cluster: rounds rotate between the three on the same
processes and buffers; each round's time is the slowest rank's.

* ``ring``: the rack-ordered ring all-gather (its check rides in its messages);
* ``multicast, check first``: the check (a header to the right neighbour and an
  all-reduce of the digests) is put in flight, the own payload encoded, and the check
  settled before the broadcasts are posted (the order of the code before this change;
  ``executor.CHECK_BESIDE_BROADCASTS = False``; operation ids from the call numbers, as
  shipped);
* ``multicast, check beside``: the broadcasts posted first, the check settled while they
  are on the wire (what ships).

    python benchmarks/multicast_check_2026-11-26/check_beside.py --hosts 8 --racks 2 \
        --link 1gbit --uplink 500mbit --mtu 1500 --sizes 4M,8M,16M --codecs int8,none \
        --rounds 12 [--calls 4] --json PATH

With ``--calls M`` each round times M calls back to back (no barrier between them, as
FSDP issues its all-gathers) and reports the time per call: a rank that posts its
broadcasts early then sends into peers still finishing the previous call, which keep
(stash) those datagrams and replay them in Python; the datagrams stashed per call on
rank 0 are reported too.

Run as root (it makes an emulated cluster), nothing else running.
"""

from __future__ import annotations

import statistics
import sys

import torch

from commpress.bench.paired import difference_deciles, interleaved_rounds, paired_arguments
from commpress.bench.report import write_json
from commpress.cluster.commands import cluster_from, multicast_options
from commpress.cluster.jobs import main_of_script
from commpress.codecs import get_codec
from commpress.collectives import executor
from commpress.collectives.all_gather import gather
from commpress.collectives.fingerprint import Fingerprint
from commpress.transport import multicast

VARIANTS = ("ring", "multicast, check first", "multicast, check beside")


def _call(variant: str, out, inp, codec) -> None:
    algorithm = "ring" if variant == "ring" else "multicast"
    executor.CHECK_BESIDE_BROADCASTS = variant == VARIANTS[2]
    fingerprint = Fingerprint.of("all_gather", inp, codec, algorithm)
    gather(out, inp, None, codec, algorithm, None, fingerprint)


def _rounds(out, inp, codec, rounds: int, calls: int):
    """Per variant: ms per call of each round (the slowest rank's), and the datagrams this
    rank stashed in all of them."""
    stats = multicast.channel_for(None).engine.stats
    stashed = dict.fromkeys(VARIANTS, 0)
    current = []

    def switch(variant: str):
        current[:] = [variant]
        before = stats.stashed

        def count() -> None:
            stashed[variant] += stats.stashed - before

        return count

    def call() -> None:
        for _ in range(calls):
            _call(current[0], out, inp, codec)

    seconds = interleaved_rounds(call, VARIANTS, rounds, switch, warmup=0)
    return {v: [s / calls * 1e3 for s in seconds[v]] for v in VARIANTS}, stashed


def _worker(rank, world_size, options, sizes, codecs, rounds, calls):
    multicast.configure(None, multicast.Options(**options))
    rows = []
    for size in sizes:
        for name in codecs:
            codec = get_codec(name)
            shard = size // 4 // world_size
            inp, out = torch.randn(shard), torch.empty(shard * world_size)
            for variant in VARIANTS:  # warm-up; the first sets the channel up
                _call(variant, out, inp, codec)
            times, stashed = _rounds(out, inp, codec, rounds, calls)
            row = {"size_bytes": size, "codec": name, "calls per round": calls}
            for variant in VARIANTS:
                row[variant] = statistics.median(times[variant])
                row[f"{variant}: every round"] = times[variant]
                row[f"{variant}: stashed per call (rank 0)"] = stashed[variant] / rounds / calls
            row["beside - first"] = difference_deciles(times[VARIANTS[2]], times[VARIANTS[1]])
            rows.append(row)
    return rows if rank == 0 else None


def main() -> int:
    defaults = dict(prefix="mcc", sizes="4M,8M,16M", codecs="int8,none", rounds=12)
    parser = paired_arguments(__doc__.splitlines()[0], **defaults)
    parser.add_argument("--calls", type=int, default=1, help="calls back to back per round")
    args = parser.parse_args()
    sizes = args.sizes
    with cluster_from(args) as cluster:
        rows = cluster.run(
            _worker, multicast_options(cluster), sizes, args.codecs, args.rounds,
            args.calls, timeout=1800,
        )[0]  # fmt: skip
        where = cluster.describe()
    per = f"{args.calls} calls back to back per round, " if args.calls > 1 else ""
    print(
        f"# all-gather, {where}: {per}medians of {args.rounds} rounds, ms per call (slowest rank)"
    )
    columns = " | ".join(VARIANTS)
    print(f"| size | codec | {columns} | beside - first | ring / first | ring / beside |")
    print("|---:|---|---:|---:|---:|---|---:|---:|")
    for row in rows:
        ring, first, beside = (row[variant] for variant in VARIANTS)
        median, low, high = row["beside - first"]
        cells = [f"{row['size_bytes'] >> 20} MiB", row["codec"], f"{ring:.1f}", f"{first:.1f}"]
        cells += [f"{beside:.1f}", f"{median:+.1f} ({low:+.1f} .. {high:+.1f})"]
        cells += [f"{ring / first:.2f}", f"{ring / beside:.2f}"]
        print("| " + " | ".join(cells) + " |")
    print("\ndatagrams stashed per call on rank 0 (a later operation's, kept and replayed):")
    for row in rows:
        counts = ", ".join(
            f"{v} {row[f'{v}: stashed per call (rank 0)']:.0f}" for v in VARIANTS[1:]
        )
        print(f"{row['size_bytes'] >> 20} MiB {row['codec']}: {counts}")
    if args.json:
        write_json(args.json, rows, where=where)
    return 0


if __name__ == "__main__":  # run from the module, so that the ranks can import _worker
    sys.exit(main_of_script(__file__))
