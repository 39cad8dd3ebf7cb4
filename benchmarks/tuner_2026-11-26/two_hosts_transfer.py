"""torch's own all-gather of 32 MiB shards on 2 emulated hosts, timed five times, with the
TCP retransmission and timeout counters of each host's namespace around them.

    NUMEL=8388608 commpress launch --hosts 2 --link 1gbit --prefix mce -- \
        python benchmarks/tuner_2026-11-26/two_hosts_transfer.py
"""

import os
import subprocess
import time

import torch
import torch.distributed as dist

COUNTERS = ("TcpExtTCPTimeouts", "TcpRetransSegs", "TcpExtTCPLossProbes")


def tcp_counters() -> dict[str, int]:
    text = subprocess.run(["nstat", "-az", *COUNTERS], capture_output=True, text=True).stdout
    rows = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    return {row[0]: int(row[1]) for row in rows}


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    inp = torch.ones(int(os.environ.get("NUMEL", 1 << 23)))
    out = torch.empty(inp.numel() * world)
    dist.all_gather_into_tensor(out, inp)
    before = tcp_counters()
    for _ in range(5):
        dist.barrier()
        start = time.perf_counter()
        dist.all_gather_into_tensor(out, inp)
        dist.barrier()
        if rank == 0:
            print(f"{(time.perf_counter() - start) * 1e3:.1f} ms")
    after = tcp_counters()
    print(rank, {name: after[name] - before.get(name, 0) for name in after})


if __name__ == "__main__":
    main()
