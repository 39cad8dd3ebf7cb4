"""CPU time of the calling thread per checked and unchecked int8 ring call.

``python benchmarks/check_overlap_2026-11-25/thread_cpu.py OP SIZE ROUNDS VARIANT,...``
(OP ``all_gather`` or ``reduce_scatter``; 4 local processes on the loopback, no emulated
link: the transfers are fast, so what differs between variants is the work of the thread
that runs the executor). The executor is called on the calling thread (no hand-over to the
communication thread); variants as in ``check_parts.py`` (``check``, ``check-noheaders``,
``check-nohold``, ``nocheck``, ...), interleaved call by call, their order rotated each
round. Prints, per rank, the mean ``time.thread_time()`` of each variant's call in us.
"""

from __future__ import annotations

import statistics
import sys
import time

from commpress.cluster.jobs import main_of_script


def worker(rank, world_size, op, size, rounds, variants):
    import check_parts
    import torch

    from commpress.codecs import get_codec
    from commpress.collectives.all_gather import gather
    from commpress.collectives.fingerprint import Fingerprint
    from commpress.collectives.reduce_scatter import reduce

    codec, piece = get_codec("int8"), 1 << 20
    if op == "reduce_scatter":
        inp = torch.randn(size // 4)
        mine = Fingerprint(op, "ring", inp.numel(), "float32", "int8", "sum", piece)

        def call(fingerprint):
            reduce(inp, None, codec, "ring", piece, None, fingerprint)
    else:
        inp = torch.randn(size // 4 // world_size)
        out = torch.empty(inp.numel() * world_size)
        mine = Fingerprint(op, "ring", inp.numel(), "float32", "int8")

        def call(fingerprint):
            gather(out, inp, None, codec, "ring", None, fingerprint)

    seconds = {variant: [] for variant in variants}
    for index in range(rounds):
        shift = index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            undo = check_parts._unsafe(variant)
            start = time.thread_time()
            call(None if variant.startswith("nocheck") else mine)
            seconds[variant].append(time.thread_time() - start)
            undo()
    return {variant: statistics.mean(values) * 1e6 for variant, values in seconds.items()}


def main() -> None:
    from commpress.cluster.local import run_distributed

    op, size, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    variants = sys.argv[4].split(",")
    results = run_distributed(worker, 4, op, size, rounds, variants, timeout=1800)
    print(f"{op}, {size} B, 4 ranks on the loopback, {rounds} rounds: us of calling-thread CPU")
    for rank, means in enumerate(results):
        print(f"rank {rank}: " + "  ".join(f"{v}={means[v]:.0f}" for v in variants))


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
