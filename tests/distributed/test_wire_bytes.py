"""The bytes each collective really hands to the transport equal what it reports.

The schedules (:func:`commpress.schedules.wire_bytes`) are the one source of the bench's
``wire(B)`` and the FSDP/DDP counters; here every send is recorded at the transport (each
point-to-point batch, and the backend's all-gather and all-to-all, which send their
input to each of the n - 1 peers) and compared with them, for fp32 and bf16 input. The
emulated cluster's interface counters check the same on a real link
(``tests/cluster/test_bench.py``, root only).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.schedules import wire_bytes
from commpress.transport import collective, p2p

WORLD = 3
NUMEL = 3 * 700_001  # several 2 MiB ring pieces per chunk, and a partial block
CASES = [
    (op, algorithm, codec, dtype)
    for op in ("all_gather", "reduce_scatter", "all_reduce")
    for algorithm in ("ring", "ring-hop", "alltoall", "backend")
    for codec in ("none", "int8")
    for dtype in ("float32", "bfloat16")
    if not (op == "all_gather" and algorithm == "alltoall")
]


@contextlib.contextmanager
def _recording(world_size):
    """Every byte handed to the transport while the block runs, appended to the list it
    yields: each point-to-point batch's sends, and the backend's all-gather and all-to-all,
    which send their input to each of the n - 1 peers."""
    sent = []
    real_batch, real_all_gather, real_all_to_all = (
        p2p.Batch,
        collective.all_gather,
        collective.all_to_all,
    )

    def batch(group, sends, receives):
        sent.extend(tensor.numel() * tensor.element_size() for tensor, _ in sends)
        return real_batch(group, sends, receives)

    def all_gather(out, inp, group):
        sent.append(inp.numel() * inp.element_size() * (world_size - 1))
        return real_all_gather(out, inp, group)

    def all_to_all(out, inp, group):
        # The own slot is part of the buffer but never leaves the host.
        sent.append(inp.numel() * inp.element_size() * (world_size - 1) // world_size)
        return real_all_to_all(out, inp, group)

    p2p.Batch, collective.all_gather, collective.all_to_all = batch, all_gather, all_to_all
    try:
        yield sent
    finally:
        p2p.Batch, collective.all_gather = real_batch, real_all_gather
        collective.all_to_all = real_all_to_all


def _recorded(rank, world_size, cases):
    results = {}
    with _recording(world_size) as sent:
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
            reported = wire_bytes(
                op, algorithm, codec, inp.numel(), world_size, dtype, in_band_check=True
            )
            results[op, algorithm, codec, dtype_name] = (sum(sent), reported)
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
        payloads = {}
        for dtype in (torch.bfloat16, torch.float32):
            sent, _ = recorded[0][op, "ring", "none", str(dtype).removeprefix("torch.")]
            headers = wire_bytes(op, "ring", "none", NUMEL, WORLD, dtype, in_band_check=True)
            payloads[dtype] = sent - (headers - wire_bytes(op, "ring", "none", NUMEL, WORLD, dtype))
        native = wire_bytes(op, "native", "none", NUMEL, WORLD, torch.bfloat16)
        assert payloads[torch.bfloat16] == native
        assert payloads[torch.bfloat16] * 2 == payloads[torch.float32]


#: (integration, spec): ring chains carry a header on every message; alltoall and backend
#: send one header alone before their transfers.
ADAPTER_CASES = [
    ("ddp", "int8"),
    ("ddp", "int8@alltoall"),
    ("fsdp", "int8"),
    ("fsdp", "int8@backend"),
]


def _adapters_recorded(rank, world_size):
    """One training step through each integration, every byte handed to the transport
    recorded; what the adapter's counters say it sent alongside."""
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))

    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(rank))
    results = {}
    with _recording(world_size) as sent:
        for adapter, spec in ADAPTER_CASES:
            if adapter == "ddp":
                ddp = DistributedDataParallel(model())
                state, hook = cp.ddp.hook(spec)
                ddp.register_comm_hook(state, hook)
                sent.clear()
                ddp(x).sum().backward()
                results[adapter, spec] = (sum(sent), state.stats.wire_bytes)
                continue
            sharded = model()
            mesh = cp.fsdp.cpu_mesh()
            for layer in sharded:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(sharded, mesh=mesh)
            stats = cp.fsdp.compress(sharded, all_gather=spec, reduce_scatter="int8")
            sent.clear()
            sharded(x).sum().backward()
            counted = stats.all_gather.wire_bytes + stats.reduce_scatter.wire_bytes
            results[adapter, spec] = (sum(sent), counted)
    return results


@pytest.fixture(scope="module")
def adapters_recorded():
    return run_distributed(_adapters_recorded, WORLD, timeout=180)


@pytest.mark.parametrize("case", ADAPTER_CASES, ids=lambda case: "-".join(case))
def test_the_adapters_count_the_bytes_they_send_headers_included(adapters_recorded, case):
    for results in adapters_recorded:
        sent, counted = results[case]
        assert sent > 0 and counted == sent


def _recorded_with_window(rank, world_size, window):
    """The ring's bytes with ``window`` steps in flight: sent, and as counted."""
    from commpress.collectives import executor
    from commpress.collectives.inband import call_wire_bytes

    executor.WINDOW = window
    results = {}
    with _recording(world_size) as sent:
        for op in ("all_gather", "reduce_scatter"):
            inp = torch.randn(3 * 1000)
            sent.clear()
            if op == "all_gather":
                cp.all_gather_into_tensor(inp.new_empty(3 * inp.numel()), inp, codec="int8")
            else:
                cp.reduce_scatter_tensor(inp.new_empty(1000), inp, codec="int8")
            results[op] = (sum(sent), call_wire_bytes(op, "ring", "int8", inp, None))
    return results


def test_a_window_of_several_steps_counts_the_one_header_it_sends():
    """With more than one step in flight the ring's check travels as one header alone,
    not in every message: the counters once still charged a header per message."""
    for results in run_distributed(_recorded_with_window, WORLD, 2, timeout=120):
        for op, (sent, counted) in results.items():
            assert counted == sent, op
