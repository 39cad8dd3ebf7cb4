"""The datagram rate one receiver of the multicast transport sustains (issue 13, point 6).

Two emulated hosts on links fast enough not to limit (10 Gbit/s); host 0 broadcasts a
payload to host 1 alone (one reliable broadcast: the same engine and sockets as the
all-gather, with an empty payload from host 1), paced at a rate that the sweep raises.
Per rate: the time to deliver the payload, the datagrams per second that arrived, the
datagrams the root had to send again (what the receiver dropped: its socket buffer
overflowed because its thread could not keep up), and the receiver thread's CPU time per
datagram. Medians of REPEATS.

    python benchmarks/multicast_2026-11-25/packet_rate.py --mtu 1500 --json PATH
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

from commpress.bench.report import write_json
from commpress.cluster import Emulated
from commpress.cluster.jobs import main_of_script
from commpress.transport import multicast
from commpress.transport.reliable_broadcast import Operation

PAYLOAD_BYTES = 32 << 20
REPEATS = 3
RATES = (250 * 10**6, 500 * 10**6, 10**9, 2 * 10**9, 4 * 10**9)


def _engine_cpu() -> float:
    for thread in threading.enumerate():
        if thread.name == "commpress-multicast" and thread.is_alive():
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def _worker(rank, world_size, rates):
    rows, calls = [], 0
    for rate in rates:
        multicast.configure(None, rate_bits=rate)
        channel = multicast.channel_for(None)
        engine = channel.engine
        samples = []
        for _ in range(REPEATS):
            payload = bytearray(PAYLOAD_BYTES if rank == 0 else 0)
            incoming = {1 - rank: memoryview(bytearray(0 if rank == 0 else PAYLOAD_BYTES))}
            operation_id = channel.operation_id(calls)
            calls += 1
            operation = Operation(operation_id, [0, 1], memoryview(payload), incoming)
            repairs, received = engine.stats.repairs_sent, engine.stats.datagrams_received
            cpu = _engine_cpu()
            dist.barrier()
            start = time.perf_counter()
            engine.post(operation)
            assert operation.wait(0, 120) and operation.wait(1, 120)
            seconds = time.perf_counter() - start
            mine = torch.tensor(
                [
                    seconds,
                    engine.stats.repairs_sent - repairs,
                    engine.stats.datagrams_received - received,
                    _engine_cpu() - cpu,
                ],
                dtype=torch.float64,
            )
            both = torch.empty(8, dtype=torch.float64)
            dist.all_gather_into_tensor(both, mine)
            root, receiver = both.view(2, 4).tolist()
            samples.append((receiver[0], root[1], receiver[2], receiver[3]))
        seconds = statistics.median(s[0] for s in samples)
        datagrams = statistics.median(s[2] for s in samples)
        rows.append(
            {
                "pace_bits": rate * 0.95,
                "mtu": engine.network.mtu,
                "payload_bytes": PAYLOAD_BYTES,
                "seconds": seconds,
                "goodput_mbit": PAYLOAD_BYTES * 8 / seconds / 1e6,
                "datagrams_per_s": datagrams / seconds,
                "repairs": statistics.median(s[1] for s in samples),
                "receiver_cpu_us_per_datagram": statistics.median(
                    s[3] / s[2] * 1e6 for s in samples
                ),
            }
        )
    return rows if rank == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--prefix", default="mcr")
    parser.add_argument("--json")
    args = parser.parse_args()
    with Emulated(2, "10gbit", mtu=args.mtu, prefix=args.prefix) as cluster:
        rows = cluster.run(_worker, RATES, timeout=1800)[0]
        where = cluster.describe()
    print(f"# one root, one receiver, {where}, {PAYLOAD_BYTES} B, median of {REPEATS}")
    print(" | ".join(rows[0]))
    for row in rows:
        print(" | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()))
    if args.json:
        write_json(args.json, rows, where=where)
    return 0


if __name__ == "__main__":  # run from the module, so that the ranks can import _worker
    sys.exit(main_of_script(__file__))
