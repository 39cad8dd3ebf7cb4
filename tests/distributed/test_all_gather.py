"""Ring all-gather against torch.distributed on gloo, world sizes 2, 3 and 4."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import DistributedError, run_distributed
from commpress.collectives import all_gather_into_tensor
from commpress.testing.silence import CommunicationAttempted, forbid_communication

WORLD_SIZES = [2, 3, 4]
SIZES = [1, 255, 1000, 4097]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def shard(rank: int, numel: int, dtype: torch.dtype, constant_blocks: int = 0) -> torch.Tensor:
    """Rank-specific data; with ``constant_blocks``, constant within each block of that size."""
    generator = torch.Generator().manual_seed(1000 + rank)
    if constant_blocks:
        levels = (torch.randn(numel // constant_blocks + 1, generator=generator) * 8).round() / 4
        return levels.repeat_interleave(constant_blocks)[:numel].to(dtype)
    return (torch.randn(numel, generator=generator) * 3).to(dtype)


def gather(algorithm: str, codec: str, inp: torch.Tensor, world_size: int, group=None):
    out = torch.empty(world_size * inp.numel(), dtype=inp.dtype)
    all_gather_into_tensor(out, inp, group, codec=codec, algorithm=algorithm)
    return out


def _parity_with_native(rank, world_size):
    """Every (algorithm, codec, dtype, size) on one process group; returns this rank's outputs."""
    outputs = {}
    for dtype in DTYPES:
        for numel in SIZES:
            inp = shard(rank, numel, dtype)
            outputs[("native", dtype, numel)] = gather("native", "none", inp, world_size)
            for algorithm in ("ring", "ring-hop"):
                for codec in ("none", "int8", "int4:block=64"):
                    key = (algorithm, codec, dtype, numel)
                    outputs[key] = gather(algorithm, codec, inp, world_size)
            constant = shard(rank, numel, dtype, constant_blocks=16)
            outputs[("constant", dtype, numel)] = gather(
                "ring", "int8:block=16", constant, world_size
            )
    return outputs


@pytest.fixture(scope="module", params=WORLD_SIZES)
def parity_run(request):
    world_size = request.param
    return world_size, run_distributed(_parity_with_native, world_size)


def test_codec_none_equals_native_bit_for_bit(parity_run):
    world_size, results = parity_run
    for outputs in results:
        for dtype in DTYPES:
            for numel in SIZES:
                native = outputs[("native", dtype, numel)]
                expected = torch.cat([shard(r, numel, dtype) for r in range(world_size)])
                assert torch.equal(native, expected)
                for algorithm in ("ring", "ring-hop"):
                    assert torch.equal(outputs[(algorithm, "none", dtype, numel)], native)


def test_ring_outputs_are_bitwise_identical_on_every_rank(parity_run):
    _, results = parity_run
    for key, value in results[0].items():
        if key[0] in ("ring", "ring-hop"):
            for other in results[1:]:
                assert torch.equal(other[key].view(torch.uint8), value.view(torch.uint8)), key


def test_ring_hop_gives_the_bits_of_ring(parity_run):
    """Every codec here is idempotent: re-encoding a decoded shard at each hop gives back
    its payload, so the shards arrive as ``ring`` forwards them."""
    _, results = parity_run
    for outputs in results:
        for (algorithm, *case), value in outputs.items():
            if algorithm == "ring-hop":
                assert torch.equal(value, outputs[("ring", *case)]), case


def test_lossy_ring_error_within_codec_bound(parity_run):
    world_size, results = parity_run
    for outputs in results:
        for dtype in DTYPES:
            for numel in SIZES:
                for codec in ("int8", "int4:block=64"):
                    exact = torch.cat([shard(r, numel, dtype) for r in range(world_size)])
                    bound = torch.cat(
                        [
                            cp.get_codec(codec).error_bound(shard(r, numel, dtype))
                            for r in range(world_size)
                        ]
                    )
                    # Decoding to a 16-bit dtype adds one rounding of that dtype.
                    bound = bound + exact.float().abs() * torch.finfo(dtype).eps
                    got = outputs[("ring", codec, dtype, numel)].float()
                    assert torch.all((got - exact.float()).abs() <= bound), (codec, dtype, numel)


def test_constant_blocks_gather_exactly(parity_run):
    world_size, results = parity_run
    for outputs in results:
        for dtype in DTYPES:
            for numel in SIZES:
                expected = torch.cat(
                    [shard(r, numel, dtype, constant_blocks=16) for r in range(world_size)]
                )
                assert torch.equal(outputs[("constant", dtype, numel)], expected)


def _on_subgroup(rank, world_size):
    """Ranks 1..n-1 gather among themselves while rank 0 sits out."""
    members = list(range(1, world_size))
    group = dist.new_group(members)
    if rank == 0:
        return None
    inp = shard(rank, 777, torch.float32)
    ring = gather("ring", "int8", inp, len(members), group)
    native = gather("native", "none", inp, len(members), group)
    return ring, native


def test_subgroup():
    results = run_distributed(_on_subgroup, 4)
    assert results[0] is None
    ring, native = results[1]
    expected = torch.cat([shard(r, 777, torch.float32) for r in (1, 2, 3)])
    assert torch.equal(native, expected)
    assert (ring - expected).abs().max() <= expected.abs().max() / 254 * 1.001
    for other_ring, _ in results[2:]:
        assert torch.equal(other_ring, ring)


def _nan_in_one_shard(rank, world_size):
    inp = shard(rank, 600, torch.float32)
    if rank == 1:
        inp[300] = float("nan")
    return gather("ring", "int8", inp, world_size)


def test_nan_propagates_to_every_rank():
    results = run_distributed(_nan_in_one_shard, 3)
    for out in results:
        assert torch.isnan(out[600 + 300])
        assert torch.isfinite(out[:600]).all() and torch.isfinite(out[1200:]).all()


def _non_finite_in_every_shard(rank, world_size, algorithm, codec):
    inp = shard(rank, 600, torch.float32)
    inp[17] = (float("inf"), -float("inf"), float("nan"))[rank]
    return gather(algorithm, codec, inp, world_size)


@pytest.mark.parametrize("codec", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("algorithm", ["ring", "ring-hop"])
def test_non_finite_blocks_gather_to_the_same_bits_on_every_rank(algorithm, codec):
    """``ring-hop`` re-encodes at every hop: an Inf block once decoded to x86's negative
    NaN at its owner and to the positive one after a hop elsewhere."""
    results = run_distributed(_non_finite_in_every_shard, 3, algorithm, codec)
    for out in results:  # NaNs included, bit for bit
        assert torch.equal(out.view(torch.int32), results[0].view(torch.int32))
        for rank in range(3):
            assert torch.isnan(out[rank * 600 + 17])


def _into_tensors_that_require_grad(rank, world_size):
    inp = shard(rank, 300, torch.float32)
    out = torch.zeros(300 * world_size, requires_grad=True)  # a parameter, say
    all_gather_into_tensor(out, inp, codec="none")
    expected = torch.empty(300 * world_size)
    dist.all_gather_into_tensor(expected, inp)
    summed = torch.full((5,), float(rank + 1), requires_grad=True)
    cp.all_reduce(summed, codec="none")
    return torch.equal(out.detach(), expected), summed.detach().tolist()


def test_outputs_that_require_grad_are_written_in_place():
    """Collectives are not differentiable: a leaf that requires grad is written in place,
    as torch's all_reduce writes it (it was an autograd error raised from the communication
    thread; torch 2.13's own all_gather_into_tensor raises one too, from its split)."""
    for gathered, summed in run_distributed(_into_tensors_that_require_grad, 2):
        assert gathered and summed == [3.0] * 5


def _strided(rank, world_size):
    """Gathers of strided tensors (a non-contiguous ``inp``, a strided ``out``, ``inp`` a
    strided ``out``'s own chunk) by every algorithm, with torch's on contiguous copies;
    and what an ``out`` of shared elements is told."""
    inp = shard(rank, 600, torch.float32)[::2]
    expected = torch.empty(300 * world_size)
    dist.all_gather_into_tensor(expected, inp.contiguous())
    same = {}
    for algorithm in ("native", "ring", "ring-hop", "backend"):
        into_strided = torch.zeros(600 * world_size)
        all_gather_into_tensor(into_strided[::2], inp, codec="none", algorithm=algorithm)
        in_place = torch.zeros(300 * world_size, 2)
        chunk = in_place[rank * 300 : (rank + 1) * 300, 0]
        chunk.copy_(inp)
        all_gather_into_tensor(in_place[:, 0], chunk, codec="none", algorithm=algorithm)
        same[algorithm] = (
            torch.equal(into_strided[::2], expected)
            and not into_strided[1::2].any()
            and torch.equal(in_place[:, 0], expected)
            and not in_place[:, 1].any()
        )
    shared = torch.zeros(1).expand(300 * world_size)
    with forbid_communication(), pytest.raises(ValueError) as refused:
        all_gather_into_tensor(shared, inp, codec="none")
    return same, str(refused.value)


def test_strided_tensors_gather_as_torch_gathers_them():
    """They were refused ("must be contiguous"), while torch gathers them."""
    for same, refused in run_distributed(_strided, 2):
        assert all(same.values()), same
        assert "out has elements that share memory" in refused


def _bad_shapes(rank, world_size):
    if rank != 0:  # the peer never enters a collective: a call that communicated would hang
        return None
    with forbid_communication() as attempted:
        errors = _bad_shape_errors(world_size)
    assert attempted == []
    return errors


def _bad_shape_errors(world_size):
    inp = torch.zeros(10)
    errors = []
    for out, kind in (
        (torch.zeros(10 * world_size + 1), ValueError),
        (torch.zeros(10 * world_size, dtype=torch.float16), ValueError),
        (torch.zeros(10 * world_size, dtype=torch.int64), ValueError),
    ):
        try:
            all_gather_into_tensor(out, inp, codec="int8")
        except kind as error:
            errors.append(str(error))
    try:
        all_gather_into_tensor(
            torch.zeros(20, dtype=torch.int64), torch.zeros(10, dtype=torch.int64)
        )
    except TypeError as error:
        errors.append(str(error))
    try:
        all_gather_into_tensor(torch.zeros(20), torch.zeros(10), algorithm="tree")
    except ValueError as error:
        errors.append(str(error))
    return errors


def test_bad_arguments_raise_before_any_communication():
    errors = run_distributed(_bad_shapes, 2)[0]
    assert len(errors) == 5
    assert "(21,)" in errors[0] and "(10,)" in errors[0]
    assert "same dtype" in errors[1] and "same dtype" in errors[2]
    assert "cannot take inp.dtype=torch.int64" in errors[3]
    assert "unknown algorithm 'tree'" in errors[4] and errors[4].endswith("'auto')")


def _communicates_inside_the_guard(rank, world_size):
    with forbid_communication() as attempted:
        try:
            all_gather_into_tensor(torch.zeros(20), torch.zeros(10), codec="none")
        except CommunicationAttempted:
            return attempted
    return None


def test_the_guard_catches_a_call_that_communicates():
    """The guard of the test above is not vacuous: a valid call inside it is caught."""
    for attempted in run_distributed(_communicates_inside_the_guard, 2):
        assert attempted


#: Words in the name of every torch.distributed function that moves data or waits for peers.
COMMUNICATING = ("gather", "scatter", "broadcast", "reduce", "send", "recv", "barrier", "to_all")


def test_the_guard_refuses_every_communicating_function_of_torch_distributed():
    """The object collectives (``broadcast_object_list``, ``gather_object``, ...), the
    coalesced ones and ``monitored_barrier`` passed the guard: a call that exchanged its
    values through one of them was taken for one that does not communicate. ``isend`` and
    ``irecv`` stay (``P2POp`` checks their identity; ``batch_isend_irecv`` is refused)."""
    names = [
        name
        for name in dir(dist)
        if any(word in name for word in COMMUNICATING)
        and not name.startswith("_")
        and name[0].islower()
        and callable(getattr(dist, name))
        and name not in ("isend", "irecv")
    ]
    assert "broadcast_object_list" in names
    for name in names:
        with forbid_communication() as attempted, pytest.raises(CommunicationAttempted):
            getattr(dist, name)()
        assert attempted == [name]


def _raises(rank, world_size):
    if rank == 1:
        raise RuntimeError("boom on rank 1")
    return rank


def test_harness_reports_a_failing_rank():
    with pytest.raises(DistributedError, match=r"(?s)rank 1 failed.*boom on rank 1"):
        run_distributed(_raises, 2, timeout=60)


def _multicast_alone(rank, world_size):
    inp = torch.linspace(-1, 1, 1000)
    multicast_out, ring_out = torch.empty(1000), torch.empty(1000)
    cp.all_gather_into_tensor(multicast_out, inp, codec="int8", algorithm="multicast")
    cp.all_gather_into_tensor(ring_out, inp, codec="int8", algorithm="ring")
    return torch.equal(multicast_out, ring_out) and not torch.equal(multicast_out, inp)


def test_multicast_in_a_world_of_one_needs_no_network():
    """Nothing to broadcast: no channel is set up (loopback cannot multicast), and the rank
    keeps the decoded copy of its own shard as every algorithm does."""
    assert run_distributed(_multicast_alone, 1) == [True]


def _stream_requests(rank, world_size):
    from commpress.codecs import blockwise
    from commpress.testing.stream_requests import recorded_stream_requests

    shard = blockwise.STREAM_MIN_BYTES // 4 + 1024  # each decode just past the threshold
    out = torch.empty(world_size * shard)
    with recorded_stream_requests() as gathered:
        cp.all_gather_into_tensor(out, torch.randn(shard), codec="int8")
    with recorded_stream_requests() as reduced:
        cp.all_reduce(torch.randn(world_size * shard), codec="int8")
    return gathered, reduced


def test_the_public_all_gather_streams_its_output_and_the_all_reduce_does_not():
    """The all-gather's decodes into ``out`` ask for non-temporal stores (``out`` is left to
    the caller); the all-reduce's gather into a buffer it copies out at once does not, nor
    its reduce-scatter."""
    for gathered, reduced in run_distributed(_stream_requests, 2, timeout=120):
        assert gathered == [1, 1]
        assert reduced and not any(reduced)


def _backend_posts(rank, world_size, numel):
    """Every point-to-point post of one int8 ``backend`` all-gather, ``(kind, peer,
    bytes)``; its output, and the output of the same call through gloo's own all-gather."""
    from commpress.collectives import executor
    from commpress.testing.posts import recorded_posts

    inp = shard(rank, numel, torch.float32)
    with recorded_posts() as posted:
        out = gather("backend", "int8", inp, world_size)
    default, executor.POINT_TO_POINT_FROM_BYTES = executor.POINT_TO_POINT_FROM_BYTES, None
    try:
        through_gloo = gather("backend", "int8", inp, world_size)
    finally:
        executor.POINT_TO_POINT_FROM_BYTES = default
    return posted, out, through_gloo


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_large_backend_all_gather_of_two_ranks_posts_its_receive_first(world_size):
    """On two ranks gloo's ring all-gather is one exchange with one peer, each side posting
    its send first, which gloo serialises (``benchmarks/two_ranks_2026-11-27/``): from
    ``POINT_TO_POINT_FROM_BYTES`` per peer the payloads go point to point instead, the
    receive first, with the bits gloo's own gives. On three ranks gloo's ring sends and
    receives with two different peers: left to it."""
    from commpress.codecs import get_codec

    numel = 300_000
    wire = get_codec("int8").wire_bytes(numel, torch.float32)
    results = run_distributed(_backend_posts, world_size, numel, timeout=60)
    assert all(torch.equal(out, results[0][1]) for _, out, _ in results)  # every rank alike
    for rank, (posted, out, through_gloo) in enumerate(results):
        payloads = [(kind, peer) for kind, peer, size in posted if size == wire]
        if world_size == 2:
            assert payloads == [("receive", 1 - rank), ("send", 1 - rank)], posted
        else:
            assert payloads == [], posted
        assert torch.equal(out, through_gloo)
        own = shard(rank, numel, torch.float32)
        mine = out[rank * numel : (rank + 1) * numel]
        assert bool(((mine - own).abs() <= get_codec("int8").error_bound(own)).all())
