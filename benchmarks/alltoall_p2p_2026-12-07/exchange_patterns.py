"""Raw uint8 all-to-all exchanges on gloo, interleaved call by call: every point-to-point
receive posted first, then every send, all peers at once (as the executor posts from
the size threshold, here in rotated order: from rank - i, to rank + i; the executor
posts in ascending rank order); in n - 1 rounds of one peer each way (round i: from rank - i, to
rank + i), waiting each round out; the same with the next round's receive posted ahead;
and gloo's own ``all_to_all_single``.

``python benchmarks/alltoall_p2p_2026-12-07/exchange_patterns.py HOSTS BYTES_PER_PEER``
(root; HOSTS emulated hosts at 1 Gbit/s, prefix ``cptr``; 10 rounds after 3 not kept; the
slowest rank's ms per call; ideal: the bytes one host sends at the link's rate).
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.distributed as dist

from commpress.bench.paired import interleaved_calls
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script

VARIANTS = ("at once", "rounds", "rounds, next receive ahead", "gloo all_to_all_single")


def _calls(world_size: int, per_peer: int) -> dict:
    inp = torch.zeros(per_peer * world_size, dtype=torch.uint8)
    out = torch.empty(per_peer * world_size, dtype=torch.uint8)
    rank, group = dist.get_rank(), dist.group.WORLD

    def block(tensor, peer):
        return tensor[peer * per_peer : (peer + 1) * per_peer]

    def receive(i):  # round i's: from rank - i
        peer = (rank - i) % world_size
        return group.recv([block(out, peer)], peer, 0)

    def send(i):  # round i's: to rank + i
        peer = (rank + i) % world_size
        return group.send([block(inp, peer)], peer, 0)

    def at_once():
        works = [receive(i) for i in range(1, world_size)]
        works += [send(i) for i in range(1, world_size)]
        for work in works:
            work.wait()

    def rounds():
        for i in range(1, world_size):
            works = (receive(i), send(i))
            for work in works:
                work.wait()

    def rounds_ahead():
        received = {1: receive(1)}
        for i in range(1, world_size):
            if i + 1 < world_size:
                received[i + 1] = receive(i + 1)
            sent = send(i)
            received.pop(i).wait()
            sent.wait()

    calls = (at_once, rounds, rounds_ahead, lambda: dist.all_to_all_single(out, inp))
    return dict(zip(VARIANTS, calls, strict=True))


def worker(rank, world_size, per_peer, rounds):
    return interleaved_calls(_calls(world_size, per_peer), rounds)


def main() -> None:
    hosts, per_peer = int(sys.argv[1]), int(sys.argv[2])
    with cluster_for(hosts, "1gbit", prefix="cptr") as cluster:
        times = cluster.run(worker, per_peer, 10, timeout=600)[0]
    ideal = per_peer * (hosts - 1) * 8 / 1e9 * 1e3
    print(f"{hosts} hosts at 1 Gbit/s, {per_peer} B per peer, ideal {ideal:.1f} ms")
    print("| variant | median | p25 | p75 |")
    print("|---|---:|---:|---:|")
    for variant in VARIANTS:
        q = statistics.quantiles([t * 1e3 for t in times[variant]], n=4)
        print(f"| {variant} | {q[1]:.1f} | {q[0]:.1f} | {q[2]:.1f} |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
