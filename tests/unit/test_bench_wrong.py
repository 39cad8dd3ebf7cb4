"""The bench's ``#wrong`` counting, ring order and wire bytes, checked by hand (one process).

The bounds themselves are checked against real collectives in
``tests/distributed/test_bench_correctness.py``.
"""

from __future__ import annotations

import pytest
import torch

from commpress.bench import correctness
from commpress.schedules import wire

M = 1 << 20


def test_count_wrong_counts_elements_outside_the_bound_and_nan():
    expected = torch.zeros(5, dtype=torch.float64)
    out = torch.tensor([0.0, 1.0, -1.0, 1.5, float("nan")])
    assert correctness.count_wrong(out, expected, torch.ones(5, dtype=torch.float64)) == 2


def test_ring_order_adds_the_owner_last_going_right():
    # Rank r sends to r + 1: the chunk starts at its owner's right neighbour.
    assert correctness.ring_order(0, 4) == [1, 2, 3, 0]
    assert correctness.ring_order(2, 3) == [0, 1, 2]
    assert correctness.ring_order(0, 1) == [0]


def test_bench_inputs_are_reproducible_on_any_rank():
    first = correctness.bench_input(2, 100, torch.bfloat16)
    assert first.dtype == torch.bfloat16
    assert torch.equal(first, correctness.bench_input(2, 100, torch.bfloat16))
    assert not torch.equal(first, correctness.bench_input(3, 100, torch.bfloat16))


@pytest.mark.parametrize(
    ("op", "algorithm", "codec", "dtype", "expected"),
    [
        # 4 ranks, 4M elements in (all-gather: 1M each): chunks of 1M, ring pieces of 512K.
        ("reduce_scatter", "native", "none", torch.float32, 3 * M * 4),
        ("reduce_scatter", "native", "none", torch.bfloat16, 3 * M * 2),
        ("all_reduce", "native", "none", torch.float16, 2 * 3 * M * 2),
        ("all_gather", "native", "none", torch.bfloat16, 3 * M * 2),
        # int8: one byte per element and a 4-byte scale per block of 256.
        ("reduce_scatter", "ring", "int8", torch.float32, 3 * 2 * (M // 2 + 4 * 2048)),
        ("reduce_scatter", "ring", "int8", torch.bfloat16, 3 * 2 * (M // 2 + 4 * 2048)),
        # Blocks of 1000 restart at each 512K piece: 525 scales per piece, not 1049 per chunk.
        ("reduce_scatter", "ring", "int8:block=1000", torch.float32, 3 * 2 * (M // 2 + 4 * 525)),
        ("reduce_scatter", "ring-hop", "int8:block=1000", torch.float32, 3 * (M + 4 * 1049)),
        # `none` sends bf16 partial sums as bf16, fp32 ones as fp32.
        ("reduce_scatter", "ring", "none", torch.bfloat16, 3 * M * 2),
        ("reduce_scatter", "ring", "none", torch.float32, 3 * M * 4),
        ("reduce_scatter", "alltoall", "int8", torch.bfloat16, 3 * (M + 4 * 4096)),
        ("all_reduce", "ring", "none", torch.bfloat16, 2 * 3 * M * 2),
        ("all_reduce", "ring", "int8", torch.float32, 2 * 3 * (M + 4 * 4096)),
        ("all_gather", "ring", "int4", torch.float16, 3 * (M // 2 + 4 * 4096)),
    ],
)
def test_wire_bytes_by_hand(op, algorithm, codec, dtype, expected):
    numel = M if op == "all_gather" else 4 * M
    assert wire.wire_bytes(op, algorithm, codec, numel, 4, dtype) == expected


def test_wire_bytes_of_uneven_all_reduce_chunks_count_the_padding():
    # 10 elements on 4 ranks: chunks of 3 (the last padded), 3 hops each way.
    assert wire.wire_bytes("all_reduce", "ring", "none", 10, 4, torch.float32) == 2 * 3 * 3 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("algorithm", ["ring", "ring-hop"])
def test_none_never_sends_more_bytes_than_native(op, dtype, algorithm):
    """What the FSDP/DDP counters and the bench report for ``none`` (one formula for all)."""
    for world_size in (2, 3, 4, 8):
        for numel in (8 * 1000, 8 * (1 << 20) + 8):
            native = wire.wire_bytes(op, "native", "none", numel, world_size, dtype)
            assert wire.wire_bytes(op, algorithm, "none", numel, world_size, dtype) == native


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("codec", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("op", ["all_gather", "all_reduce"])
def test_ring_hop_bound_is_the_rings(op, codec, dtype):
    """``ring-hop`` re-encodes at every hop, but runs only codecs whose decoded values
    encode to themselves (the collective refuses the others), so its results are the
    ring's, bit for bit: the bound grew by one codec error per hop a shard travelled, up to
    n - 1 of them, which hid wrong results (below)."""
    world_size, numel = 8, 8 * 300
    inputs = [correctness.bench_input(r, numel, dtype) for r in range(world_size)]
    for rank in range(world_size):
        ring = correctness.error_bound(op, "ring", codec, inputs, rank)
        hop = correctness.error_bound(op, "ring-hop", codec, inputs, rank)
        assert torch.equal(hop, ring), rank


def test_ring_hop_all_gather_counts_a_zeroed_shard_wrong():
    """8 ranks, int4: a ring-hop all-gather whose last rank left the shard of its right
    neighbour (7 hops away) zeroed counted 6% of it wrong, an all-zero output 44%."""
    from commpress.codecs import get_codec

    world_size, numel, codec = 8, 4096, get_codec("int4")
    inputs = [correctness.bench_input(r, numel, torch.float32) for r in range(world_size)]
    # what the collective gives, on every rank: each shard encoded once (ring-hop's
    # re-encodes give the same bits)
    out = torch.cat([codec.decode(codec.encode(x), numel, torch.float32) for x in inputs])
    rank = world_size - 1
    expected = correctness.expected("all_gather", inputs, rank)
    bound = correctness.error_bound("all_gather", "ring-hop", "int4", inputs, rank)
    assert correctness.count_wrong(out, expected, bound) == 0
    far = slice(0, numel)  # rank 0's shard, 7 hops from rank 7
    zeroed = out.clone()
    zeroed[far] = 0
    assert correctness.count_wrong(zeroed, expected, bound) > numel // 2
    assert correctness.count_wrong(out * 0, expected, bound) > out.numel() * 3 // 4
