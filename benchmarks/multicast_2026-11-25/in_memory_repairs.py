"""Repairs the protocol needs at 20% loss without a shaper or a CPU limit: the 8-rank
all-gather of 2 MiB shards at MTU 9000 on the in-memory network of the unit tests, against
the minimum for the losses alone (each receiver misses 20% of each root's chunks, and 20%
of each repair again). Run from the repository root:

    python benchmarks/multicast_2026-11-25/in_memory_repairs.py
"""

from __future__ import annotations

import sys

sys.path.insert(0, "tests/unit")

from test_reliable_broadcast import Hub, all_gather, check_exact, close_all, engines, random_shards

RANKS, SHARD, LOSS = 8, 2 << 20, 0.2


def main() -> None:
    hub = Hub(RANKS, mtu=9000)
    ranks = engines(hub, loss=LOSS, seed=3, rate_bits=10**9, retry_s=0.02)
    try:
        shards = random_shards(RANKS, SHARD)
        check_exact(all_gather(ranks, shards, timeout=60), shards)
        repairs = sum(e.stats.repairs_sent for e in ranks)
    finally:
        close_all(ranks)
    chunks = -(-SHARD // ranks[0].chunk_bytes)
    minimum = RANKS * (RANKS - 1) * chunks * LOSS / (1 - LOSS)
    print(f"{RANKS} ranks, {SHARD} B shards, loss {LOSS}: {repairs} repairs, {minimum:.0f} minimum")


if __name__ == "__main__":
    main()
