"""The multicast all-gather's three datagram paths, paired in one cluster: rounds rotate
between them, on the same processes and buffers, and each round's time is the slowest
rank's.

* ``one by one, Python``: each datagram its own system call each way, every datagram
  handled in Python (the code before 2026-11-26, but for reading with ``recvmsg_into``);
* ``batched, Python``: a root's consecutive datagrams sent in one system call (UDP
  segmentation offload) and read in one (UDP_GRO), still handled in Python;
* ``batched, C``: the same, the running operation's DATA datagrams taken in C
  (``transport/receive.c``): what ships.

    python benchmarks/multicast_2026-11-26/paths.py --hosts 8 --racks 2 --link 1gbit \
        --uplink 500mbit --mtu 1500 --sizes 4M,16M --codecs int8,none --rounds 12 --json PATH

Run as root (it makes an emulated cluster), nothing else running.
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch

from commpress.bench.paired import difference_deciles, interleaved_rounds, paired_arguments
from commpress.bench.report import write_json
from commpress.cluster.commands import cluster_from, multicast_options
from commpress.cluster.jobs import main_of_script
from commpress.codecs import get_codec
from commpress.collectives.all_gather import gather
from commpress.collectives.fingerprint import Fingerprint
from commpress.transport import multicast, reliable_broadcast

PATHS = ("one by one, Python", "batched, Python", "batched, C")
_SOL_UDP, _UDP_GRO = 17, 104


def _use(path: str, network, segments: bool) -> None:
    batched = path != PATHS[0]
    network._segmentation = batched and segments  # never where the kernel refused it
    for sock in network._sockets:
        sock.setsockopt(_SOL_UDP, _UDP_GRO, int(batched))
    reliable_broadcast.NATIVE_RECEIVE = path == PATHS[2]  # read at each operation's start


def _counters(network, stats) -> tuple[int, int, int, int]:
    return (network.send_calls, network.read_calls, stats.taken_natively, stats.datagrams_received)


def _rounds(call, network, stats, segments: bool, rounds: int):
    """Per path: ms of each round (the slowest rank's), and this rank's sends, reads,
    datagrams taken in C and received, summed over them."""
    counts = {path: [0, 0, 0, 0] for path in PATHS}

    def switch(path: str):
        _use(path, network, segments)
        before = _counters(network, stats)

        def count() -> None:
            moved = zip(counts[path], before, _counters(network, stats), strict=True)
            counts[path] = [total + b - a for total, a, b in moved]

        return count

    seconds = interleaved_rounds(call, PATHS, rounds, switch, warmup=0)
    return {path: [s * 1e3 for s in seconds[path]] for path in PATHS}, counts


def _worker(rank, world_size, options, sizes, codecs, rounds):
    multicast.configure(None, multicast.Options(**options))
    rows = []
    for size in sizes:
        for name in codecs:
            codec = get_codec(name)
            shard = size // 4 // world_size
            inp, out = torch.randn(shard), torch.empty(shard * world_size)
            fingerprint = Fingerprint.of("all_gather", inp, codec, "multicast")
            gather(out, inp, None, codec, "multicast", None, fingerprint)  # sets the channel up
            channel = multicast.channel_for(None)
            network, stats = channel.network, channel.engine.stats
            segments = network._segmentation
            call = functools.partial(gather, out, inp, None, codec, "multicast", None, fingerprint)
            times, counts = _rounds(call, network, stats, segments, rounds)
            _use(PATHS[2], network, segments)
            row = {"size_bytes": size, "codec": name}
            for path in PATHS:
                sends, reads, native, received = (count / rounds for count in counts[path])
                row[f"{path}: sends, reads, taken in C, received per call (rank 0)"] = (
                    sends,
                    reads,
                    native,
                    received,
                )
                row[path] = statistics.median(times[path])
                row[f"{path} - first"] = difference_deciles(times[path], times[PATHS[0]])
            rows.append(row)
    return rows if rank == 0 else None


def main() -> int:
    defaults = dict(prefix="mcp", sizes="4M,16M", codecs="int8,none", rounds=12)
    parser = paired_arguments(__doc__.splitlines()[0], **defaults)
    args = parser.parse_args()
    sizes = args.sizes
    with cluster_from(args) as cluster:
        rows = cluster.run(
            _worker, multicast_options(cluster), sizes, args.codecs, args.rounds,
            timeout=1800,
        )[0]  # fmt: skip
        where = cluster.describe()
    print(f"# multicast all-gather, {where}: medians of {args.rounds} rounds, ms (slowest rank)")
    print(f"| size | codec | {' | '.join(PATHS)} | {PATHS[1]} - first | {PATHS[2]} - first |")
    print("|---:|---|---:|---:|---:|---|---|")
    for row in rows:
        cells = [f"{row['size_bytes'] >> 20} MiB", row["codec"]]
        cells += [f"{row[path]:.1f}" for path in PATHS]
        for path in PATHS[1:]:
            median, low, high = row[f"{path} - first"]
            cells.append(f"{median:+.1f} ({low:+.1f} .. {high:+.1f})")
        print("| " + " | ".join(cells) + " |")
    print("\nper call on rank 0: system calls that sent, reads, datagrams taken in C, received")
    for row in rows:
        for path in PATHS:
            key = f"{path}: sends, reads, taken in C, received per call (rank 0)"
            sends, reads, native, received = row[key]
            print(
                f"{row['size_bytes'] >> 20} MiB {row['codec']}, {path}: {sends:.0f} sends, "
                f"{reads:.0f} reads, {native:.0f} taken in C of {received:.0f} received"
            )
    if args.json:
        write_json(args.json, rows, where=where)
    return 0


if __name__ == "__main__":  # run from the module, so that the ranks can import _worker
    sys.exit(main_of_script(__file__))
