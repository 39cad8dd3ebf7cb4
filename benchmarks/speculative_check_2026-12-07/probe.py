"""Does an argument check's verdict cost less beside a one-round exchange than before it?

``python benchmarks/speculative_check_2026-12-07/probe.py HOSTS ROUNDS PER_PEER_BYTES...``
(root; HOSTS emulated hosts at 1 Gbit/s, prefix ``cpsc``). Every variant moves the same
bytes: each rank sends ``PER_PEER_BYTES`` to every other rank point to point (receives
posted first), as a one-round all-gather of encoded shards would:

* ``exchange``: the exchange alone;
* ``verdict-then-exchange``: today's check of a schedule that is not a chain: a 32-byte
  header to the right and an all-reduce of two int64 (the verdict), both waited, then the
  exchange;
* ``verdict-beside-exchange``: the same header and all-reduce posted, the exchange posted
  at once after them; the verdict waited, then the exchange;
* ``verdict-own-group-beside-exchange``: the same, the all-reduce on a gloo group of its
  own (its own connections, so its messages queue behind no payload);
* ``gloo-all-gather``: gloo's all-gather of the same bytes per rank (``backend``'s floor).

Prints, per size, the median and quartiles of the slowest rank's milliseconds per call
and the paired median differences against ``exchange``.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist

from commpress.bench.paired import interleaved_calls, paired_difference
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.transport.p2p import Batch, Pending

VARIANTS = (
    "exchange",
    "verdict-then-exchange",
    "verdict-beside-exchange",
    "verdict-own-group-beside-exchange",
    "gloo-all-gather",
)


def _calls(rank: int, world_size: int, per_peer: int, own_group) -> dict:
    group = dist.group.WORLD
    peers = [p for p in range(world_size) if p != rank]
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    own = torch.zeros(per_peer, dtype=torch.uint8)
    inbox = {p: torch.empty(per_peer, dtype=torch.uint8) for p in peers}
    header, header_in = torch.zeros(32, dtype=torch.uint8), torch.empty(32, dtype=torch.uint8)
    verdict = torch.zeros(2, dtype=torch.int64)
    gathered = torch.empty(per_peer * world_size, dtype=torch.uint8)

    def post_exchange() -> Batch:
        return Batch(group, [(own, p) for p in peers], [(inbox[p], p) for p in peers])

    def post_check(on=group) -> tuple[Pending, Batch]:
        reduced = Pending(dist.all_reduce(verdict, dist.ReduceOp.MAX, on, async_op=True))
        return reduced, Batch(group, [(header, right)], [(header_in, left)])

    def exchange() -> None:
        post_exchange().wait(None)

    def verdict_then_exchange() -> None:
        reduced, headed = post_check()
        headed.wait(None)
        reduced.wait(None)
        post_exchange().wait(None)

    def verdict_beside_exchange(on=group) -> None:
        reduced, headed = post_check(on)
        exchanged = post_exchange()
        headed.wait(None)
        reduced.wait(None)
        exchanged.wait(None)

    def verdict_own_group_beside_exchange() -> None:
        verdict_beside_exchange(own_group)

    def gloo_all_gather() -> None:
        dist.all_gather_into_tensor(gathered, own)

    calls = (
        exchange,
        verdict_then_exchange,
        verdict_beside_exchange,
        verdict_own_group_beside_exchange,
        gloo_all_gather,
    )
    return dict(zip(VARIANTS, calls, strict=True))


def worker(rank, world_size, rounds, sizes):
    own_group = dist.new_group(backend="gloo")
    return {
        size: interleaved_calls(_calls(rank, world_size, size, own_group), rounds) for size in sizes
    }


def main() -> None:
    hosts, rounds = int(sys.argv[1]), int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    with cluster_for(hosts, "1gbit", prefix="cpsc") as cluster:
        by_size = cluster.run(worker, rounds, sizes, timeout=1200)[0]
    print(f"{hosts} hosts at 1gbit, {rounds} rounds, the slowest rank's ms per call")
    for size in sizes:
        times = {v: [t * 1e3 for t in by_size[size][v]] for v in VARIANTS}
        print(f"\n{size} bytes per peer\n| variant | median | p25 | p75 | - exchange (95% CI) |")
        print("|---|---:|---:|---:|---|")
        for variant in VARIANTS:
            low, middle, high = statistics.quantiles(times[variant], n=4)
            if variant == "exchange":
                versus = ""
            else:
                median, low_d, high_d = paired_difference(times[variant], times["exchange"])
                versus = f"{median:+.2f} ({low_d:+.2f} to {high_d:+.2f})"
            print(f"| {variant} | {middle:.2f} | {low:.2f} | {high:.2f} | {versus} |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
