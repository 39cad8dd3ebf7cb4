"""The bytes each collective really hands to the transport equal what it reports.

``commpress.collectives.wire`` is the one formula behind the bench's ``wire(B)`` and the
FSDP/DDP counters; here every send is recorded at the transport (each ring ``Exchange``
and the ``alltoall``'s all-to-all) and compared with it, for fp32 and bf16 input. The
emulated cluster's interface counters check the same on a real link
(``tests/cluster/test_bench.py``, root only).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress.collectives import all_gather, reduce_scatter
from commpress.collectives.wire import wire_bytes
from commpress.testing.distributed import run_distributed

WORLD = 3
NUMEL = 3 * 700_001  # several 2 MiB ring pieces per chunk, and a partial block
CASES = [
    (op, algorithm, codec, dtype)
    for op in ("all_gather", "reduce_scatter", "all_reduce")
    for algorithm in ("ring", "ring-hop", "alltoall")
    for codec in ("none", "int8")
    for dtype in ("float32", "bfloat16")
    if not (op != "reduce_scatter" and algorithm == "alltoall")
]


def _recorded(rank, world_size, cases):
    sent = []
    real_exchange, real_alltoall = all_gather.Exchange, dist.all_to_all_single

    def exchange(group, send, right, recv, left):
        sent.append(send.numel() * send.element_size())
        return real_exchange(group, send, right, recv, left)

    def alltoall(output, inp, *args, **kwargs):
        # The own slot is part of the buffer but never leaves the host.
        sent.append(inp.numel() * inp.element_size() * (world_size - 1) // world_size)
        return real_alltoall(output, inp, *args, **kwargs)

    all_gather.Exchange = reduce_scatter.Exchange = exchange
    dist.all_to_all_single = alltoall
    results = {}
    try:
        for op, algorithm, codec, dtype_name in cases:
            dtype = getattr(torch, dtype_name)
            shard = NUMEL // world_size
            inp = torch.randn(shard if op == "all_gather" else NUMEL).to(dtype)
            sent.clear()
            if op == "all_gather":
                out = inp.new_empty(shard * world_size)
                cp.all_gather_into_tensor(out, inp, codec=codec, algorithm=algorithm)
            elif op == "reduce_scatter":
                cp.reduce_scatter_tensor(
                    inp.new_empty(shard), inp, codec=codec, algorithm=algorithm
                )
            else:
                cp.all_reduce(inp, codec=codec, algorithm=algorithm)
            reported = wire_bytes(op, algorithm, codec, inp.numel(), world_size, dtype)
            results[op, algorithm, codec, dtype_name] = (sum(sent), reported)
    finally:
        all_gather.Exchange = reduce_scatter.Exchange = real_exchange
        dist.all_to_all_single = real_alltoall
    return results


@pytest.fixture(scope="module")
def recorded():
    return run_distributed(_recorded, WORLD, CASES, timeout=300)


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(case))
def test_the_bytes_sent_are_the_bytes_reported(recorded, case):
    for results in recorded:
        sent, reported = results[case]
        assert sent == reported


def test_none_on_bf16_sends_two_bytes_per_element_as_native(recorded):
    """The ring reduce-scatter once sent bf16 partial sums as fp32: twice native's bytes."""
    for op in ("reduce_scatter", "all_reduce"):
        sent, _ = recorded[0][op, "ring", "none", "bfloat16"]
        native = wire_bytes(op, "native", "none", NUMEL, WORLD, torch.bfloat16)
        assert sent == native
        assert sent * 2 == recorded[0][op, "ring", "none", "float32"][0]
