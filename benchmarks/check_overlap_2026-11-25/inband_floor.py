"""The floor of an in-band argument check: a bare int8 ring all-gather, with and without
what the design in this folder's README adds to it, on the emulated cluster.

``python benchmarks/check_overlap_2026-11-25/inband_floor.py HOSTS ITERS SIZE...`` (root;
HOSTS hosts at 1 Gbit/s, prefix ``cpib``). Both variants are the same hand-written ring
(point-to-point sends to the right, receives from the left, n - 1 steps, the int8 codec),
interleaved call by call in the same processes (and three more that add one part each:
``header only``, ``scratch only``, ``decodes held only``):

* ``plain``: each step's receive lands in its payload slot; each received shard is
  decoded into the output while the next step is on the wire (as the executor does);
* ``in-band``: every message starts with a 32-byte header, written before each send and
  read after each receive; the first receive is posted into a scratch buffer of
  ``FIRST`` bytes and copied to its slot; every decode into the output waits for the
  last step.

Prints, per size (bytes of the all-gather output, fp32), the median over calls of the
slowest rank's time per variant. Nothing here is the library's collective: it isolates
the mechanism's cost from everything else.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster import cluster_for
from commpress.cluster.jobs import main_of_script
from commpress.transport import p2p

HEADER = 32
FIRST = 8 << 20
WARMUP = 3
#: variant -> (header bytes, first receive through scratch, decodes held to the end)
VARIANTS = {
    "plain": (0, False, False),
    "in-band": (HEADER, True, True),
    "header only": (HEADER, False, False),
    "scratch only": (0, True, False),
    "decodes held only": (0, False, True),
}


class Ring:
    def __init__(self, numel: int, rank: int, world_size: int, variant: tuple):
        self.codec = cp.get_codec("int8")
        header, self.through_scratch, self.hold = variant
        self.rank, self.n, self.header = rank, world_size, header
        self.numel = numel
        self.wire = self.codec.wire_bytes(numel, torch.float32)
        self.slots = torch.empty(world_size, header + self.wire, dtype=torch.uint8)
        self.scratch = torch.empty(FIRST, dtype=torch.uint8)
        self.headers = self.slots.numpy()  # the same memory: a header costs no torch call
        self.left, self.right = (rank - 1) % world_size, (rank + 1) % world_size

    def _stamp(self, chunk: int, step: int) -> None:
        self.headers[chunk, : self.header] = step  # stands for writing the header fields

    def _read(self, chunk: int) -> bool:
        return int(self.headers[chunk, 0]) >= 0  # stands for reading them

    def _decode(self, chunk: int, out: torch.Tensor) -> None:
        payload = self.slots[chunk, self.header :]
        self.codec.decode(payload, self.numel, torch.float32, out=out[chunk])

    def gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        out = out.view(self.n, self.numel)
        self.codec.encode(inp, out=self.slots[self.rank, self.header :])
        stamped = self.header > 0
        if not self.hold:
            self._decode(self.rank, out)
        pending = []
        for step in range(self.n - 1):
            sent, received = (self.rank - step) % self.n, (self.rank - step - 1) % self.n
            if stamped:
                self._stamp(sent, step)
            first = self.through_scratch and step == 0
            target = self.scratch if first else self.slots[received]
            batch = p2p.Batch(None, [(self.slots[sent], self.right)], [(target, self.left)])
            if not self.hold:
                for chunk in pending:  # overlaps the transfer just posted
                    self._decode(chunk, out)
                pending = []
            batch.wait()
            if first:
                self.slots[received].copy_(self.scratch[: self.slots.shape[1]])
            if stamped:
                self._read(received)
            pending.append(received)
        if self.hold:
            pending = [self.rank, *pending]
        for chunk in pending:
            self._decode(chunk, out)


def worker(rank, world_size, sizes, iterations):
    results = {}
    for size in sizes:
        numel = size // 4 // world_size
        inp = torch.randn(numel)
        outs = {v: torch.empty(numel * world_size) for v in VARIANTS}
        rings = {v: Ring(numel, rank, world_size, flags) for v, flags in VARIANTS.items()}
        times = {v: [] for v in VARIANTS}
        for index in range(WARMUP + iterations):
            for variant in VARIANTS:
                dist.barrier()
                start = time.perf_counter()
                rings[variant].gather(inp, outs[variant])
                elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if index >= WARMUP:
                    times[variant].append(elapsed.item())
        for variant in VARIANTS:
            assert torch.equal(outs["plain"], outs[variant]), f"{variant} differs"
        results[size] = {v: statistics.median(t) for v, t in times.items()}
    return results


def main() -> None:
    hosts, iterations = int(sys.argv[1]), int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    with cluster_for(hosts, "1gbit", prefix="cpib") as cluster:
        results = cluster.run(worker, sizes, iterations, timeout=1800)[0]
    print(f"{hosts} hosts at 1 Gbit/s, bare int8 ring all-gather, median of {iterations} (ms)")
    print("| size (B) | " + " | ".join(VARIANTS) + " | in-band vs plain |")
    print("|---:|" + "---:|" * (len(VARIANTS) + 1))
    for size, row in results.items():
        cost = row["in-band"] / row["plain"] - 1
        cells = " | ".join(f"{row[v] * 1e3:.2f}" for v in VARIANTS)
        print(f"| {size} | {cells} | {cost:+.1%} |")


if __name__ == "__main__":  # run as a module, so that the ranks can import its functions
    sys.exit(main_of_script(__file__))
