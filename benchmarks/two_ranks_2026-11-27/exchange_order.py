"""gloo's point-to-point transfer between two ranks: one way (``one-way``, rank 0 to rank
1), then an exchange in three orders: both ranks post their send before their receive
(``send-first``), the same with each direction on a process
group of its own (``two-groups``), and the receive before the send (``receive-first``).
Six timed exchanges of NUMEL fp32 values each way per row, rank 0 prints milliseconds.

    commpress cluster up --hosts 2 --link 1gbit --prefix qx
    NUMEL=2097152 commpress launch --prefix qx -- \\
        python benchmarks/two_ranks_2026-11-27/exchange_order.py
    commpress cluster down --prefix qx
"""

import os

import torch
import torch.distributed as dist
from timed import print_times


def main() -> None:
    dist.init_process_group("gloo")
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    groups = dist.new_group([0, 1]), dist.new_group([0, 1])
    numel = int(os.environ.get("NUMEL", 1 << 21))
    sent, received = torch.ones(numel), torch.empty(numel)

    def one_way():
        if rank == 0:
            dist.send(sent, peer)
        else:
            dist.recv(received, peer)

    def send_first():
        for work in (dist.isend(sent, peer), dist.irecv(received, peer)):
            work.wait()

    def two_groups():
        mine, theirs = groups if rank == 0 else groups[::-1]
        works = dist.isend(sent, peer, group=mine), dist.irecv(received, peer, group=theirs)
        for work in works:
            work.wait()

    def receive_first():
        for work in (dist.irecv(received, peer), dist.isend(sent, peer)):
            work.wait()

    ideal_ms = numel * 4 * 8 / 1e9 * 1e3
    for name, exchange in (
        ("one-way", one_way),
        ("send-first", send_first),
        ("two-groups", two_groups),
        ("receive-first", receive_first),
    ) * 2:
        print_times(name, exchange, ideal_ms)


if __name__ == "__main__":
    main()
