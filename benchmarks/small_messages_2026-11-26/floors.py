"""Where the fixed cost of a small compressed all-gather goes: the library's ``ring`` and
``backend`` int8 all-gathers against the floors beneath them, interleaved call by call.

``python benchmarks/small_messages_2026-11-26/floors.py HOSTS ROUNDS SIZE...`` (root;
HOSTS hosts at 1 Gbit/s, prefix ``cpsf``). SIZE: bytes of the fp32 all-gather output.
Variants, each timed as the slowest rank's seconds per call:

* ``native``: gloo's all-gather of the fp32 tensor (torch's own collective);
* ``native-bytes``: gloo's all-gather of as many uint8 as one int8 payload (what
  ``backend`` moves, without encode, decode or argument check);
* ``p2p-ring``: the ring's transfers alone, from Python: world-1 steps, each one send to
  the right and one receive from the left of a payload's bytes, posted together
  (``ProcessGroup.send/recv``, as the library posts them) and waited before the next (as
  the library did before ``e638f4f``);
* ``p2p-ring-ahead``: the same, each next receive posted as soon as the step's own has
  arrived, before its send is waited (gloo moves a message only once its receive is
  posted);
* ``p2p-direct``: the same bytes in one round: every rank posts a receive from each peer
  and sends its payload to each, all at once, then waits for them all (the floor of an
  algorithm that is not in the library: a ring's world-1 hops in one);
* ``ring``: the library's int8 ring all-gather as a user calls it (argument checks, the
  hand-over to the communication thread, the in-band argument check);
* ``ring-bare``: the same ring's executor called straight on the calling thread, without
  the argument check (``commpress.collectives.all_gather.gather``);
* ``backend``: the library's int8 backend all-gather (argument check on).

Prints the median time of each, its fixed cost (time minus the ideal time of its bytes at
1 Gbit/s) and, against ``p2p-ring``, the paired median difference with its 95% interval;
then the paired differences of :data:`PAIRS` (what the public call adds to the bare executor).
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist

import commpress as cp
from commpress.bench.paired import interleaved_calls, paired_difference
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.codecs import get_codec
from commpress.collectives.all_gather import gather

VARIANTS = (
    "native",
    "native-bytes",
    "p2p-ring",
    "p2p-ring-ahead",
    "p2p-direct",
    "ring",
    "ring-bare",
    "backend",
)
PAIRS = (("ring", "ring-bare"),)
LINK_BITS = 1e9
WARMUP = 3


def _calls(size: int, rank: int, world_size: int) -> dict:
    codec = get_codec("int8")
    shard = size // 4 // world_size
    inp, out = torch.randn(shard), torch.empty(shard * world_size)
    payload = codec.wire_bytes(shard, torch.float32)
    raw_in = torch.zeros(payload, dtype=torch.uint8)
    raw_out = torch.empty(payload * world_size, dtype=torch.uint8)
    group = dist.group.WORLD
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    buffers = [torch.zeros(payload, dtype=torch.uint8) for _ in range(world_size)]

    def p2p_ring():
        for step in range(world_size - 1):
            sent = group.send([buffers[step]], right, 0)
            received = group.recv([buffers[step + 1]], left, 0)
            sent.wait()
            received.wait()

    def p2p_ring_ahead():
        received = group.recv([buffers[1]], left, 0)
        for step in range(world_size - 1):
            sent = group.send([buffers[step]], right, 0)
            received.wait()
            if step + 2 < world_size:
                received = group.recv([buffers[step + 2]], left, 0)
            sent.wait()

    others = [peer for peer in range(world_size) if peer != rank]

    def p2p_direct():
        works = [group.recv([buffers[peer]], peer, 0) for peer in others]
        works += [group.send([buffers[rank]], peer, 0) for peer in others]
        for work in works:
            work.wait()

    return {
        "p2p-ring-ahead": p2p_ring_ahead,
        "p2p-direct": p2p_direct,
        "native": lambda: dist.all_gather_into_tensor(out, inp),
        "native-bytes": lambda: dist.all_gather_into_tensor(raw_out, raw_in),
        "p2p-ring": p2p_ring,
        "ring": lambda: cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="ring"),
        "ring-bare": lambda: gather(out, inp, group, codec, "ring", None, stream_output=True),
        "backend": lambda: cp.all_gather_into_tensor(out, inp, codec="int8", algorithm="backend"),
    }


def worker(rank, world_size, sizes, rounds):
    return {
        size: interleaved_calls(_calls(size, rank, world_size), rounds, WARMUP) for size in sizes
    }


def _ideal_ms(variant: str, size: int, hosts: int) -> float:
    shard = size // 4 // hosts
    payload = get_codec("int8").wire_bytes(shard, torch.float32)
    per_host = 4 * shard if variant == "native" else payload
    return (hosts - 1) * per_host * 8 / LINK_BITS * 1e3


def main() -> None:
    hosts, rounds = int(sys.argv[1]), int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    with cluster_for(hosts, "1gbit", prefix="cpsf") as cluster:
        results = cluster.run(worker, sizes, rounds, timeout=3600)[0]
    print(f"{hosts} hosts at 1 Gbit/s, {rounds} rounds, medians of the slowest rank (ms)")
    print("| size (B) | variant | time | ideal | fixed cost | minus p2p-ring (95% interval) |")
    print("|---:|---|---:|---:|---:|---:|")
    for size, times in results.items():
        for variant in VARIANTS:
            median = statistics.median(times[variant]) * 1e3
            ideal = _ideal_ms(variant, size, hosts)
            middle, low, high = (
                1e3 * t for t in paired_difference(times[variant], times["p2p-ring"])
            )
            print(
                f"| {size} | {variant} | {median:.2f} | {ideal:.2f} | {median - ideal:.2f} | "
                f"{middle:+.2f} ({low:+.2f} to {high:+.2f}) |"
            )
    print("\n| size (B) | paired difference | median (95% interval) |")
    print("|---:|---|---:|")
    for size, times in results.items():
        for a, b in PAIRS:
            middle, low, high = (1e3 * t for t in paired_difference(times[a], times[b]))
            print(f"| {size} | {a} - {b} | {middle:+.2f} ({low:+.2f} to {high:+.2f}) |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
