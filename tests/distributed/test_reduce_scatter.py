"""Reduce-scatter and all-reduce against torch.distributed on gloo, world sizes 2, 3 and 4."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.codecs import get_codec
from commpress.collectives import all_reduce, executor, reduce_scatter_tensor
from commpress.schedules.registry import ERROR_FEEDBACK_ALGORITHMS
from commpress.testing.posts import recorded_posts
from commpress.testing.silence import forbid_communication

WORLD_SIZES = [2, 3, 4]
CHUNKS = [1, 255, 1000, 4097]  # elements each rank keeps
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
COMPRESSED = ["ring", "ring-hop", "alltoall"]
SMALL_PIECES = 1024  # chunk_bytes: 256-element pieces, so the ring pipeline has several


def contribution(rank: int, numel: int, dtype=torch.float32, integers: bool = False):
    generator = torch.Generator().manual_seed(7 * numel + rank)
    x = torch.randn(numel, generator=generator) * 4
    return (x.round() if integers else x).to(dtype)


def _run_cases(rank, world_size):
    results = {}
    for dtype in DTYPES:
        for chunk in CHUNKS:
            inp = contribution(rank, chunk * world_size, dtype, integers=True)
            native = torch.empty(chunk, dtype=dtype)
            dist.reduce_scatter_tensor(native, inp)
            results[("native", dtype, chunk)] = native
            for algorithm in COMPRESSED:
                for chunk_bytes in (SMALL_PIECES, cp.collectives.DEFAULT_CHUNK_BYTES):
                    out = torch.empty(chunk, dtype=dtype)
                    reduce_scatter_tensor(
                        out, inp, codec="none", algorithm=algorithm, chunk_bytes=chunk_bytes
                    )
                    results[("none", algorithm, chunk_bytes, dtype, chunk)] = out
    for chunk in CHUNKS:
        inp = contribution(rank, chunk * world_size, integers=True)
        native = torch.empty(chunk)
        dist.reduce_scatter_tensor(native, inp, op=dist.ReduceOp.AVG)
        ours = torch.empty(chunk)
        reduce_scatter_tensor(ours, inp, op=dist.ReduceOp.AVG, codec="none")
        results[("avg", chunk)] = (native, ours)
        real = contribution(rank, chunk * world_size)
        for algorithm in COMPRESSED:
            out = torch.empty(chunk)
            reduce_scatter_tensor(
                out, real, codec="int8", algorithm=algorithm, chunk_bytes=SMALL_PIECES
            )
            results[("int8", algorithm, chunk)] = out
    for numel in (7, 1001):  # not divisible by the world size
        integers = contribution(rank, numel, integers=True)
        native = integers.clone()
        dist.all_reduce(native)
        for algorithm in COMPRESSED:
            exact, lossy = integers.clone(), contribution(rank, numel)
            all_reduce(exact, codec="none", algorithm=algorithm)
            all_reduce(lossy, codec="int8", algorithm=algorithm)
            results[("all_reduce", algorithm, numel)] = (native, exact, lossy)
    return results


@pytest.fixture(scope="module", params=WORLD_SIZES)
def run(request):
    return request.param, run_distributed(_run_cases, request.param)


def test_codec_none_equals_native_bit_for_bit(run):
    world_size, results = run
    for rank, outputs in enumerate(results):
        for dtype in DTYPES:
            for chunk in CHUNKS:
                native = outputs[("native", dtype, chunk)]
                expected = sum(
                    contribution(r, chunk * world_size, integers=True).view(world_size, -1)[rank]
                    for r in range(world_size)
                ).to(dtype)
                assert torch.equal(native, expected)
                for algorithm in COMPRESSED:
                    for chunk_bytes in (SMALL_PIECES, cp.collectives.DEFAULT_CHUNK_BYTES):
                        got = outputs[("none", algorithm, chunk_bytes, dtype, chunk)]
                        assert torch.equal(got, native), (algorithm, chunk_bytes, dtype, chunk)


def test_average_equals_native(run):
    _, results = run
    for outputs in results:
        for chunk in CHUNKS:
            native, ours = outputs[("avg", chunk)]
            assert torch.equal(ours, native)


def exact_sum_and_parts(rank, world_size, chunk):
    parts = [
        contribution(r, chunk * world_size).view(world_size, -1)[rank].double()
        for r in range(world_size)
    ]
    return sum(parts), parts


def test_int8_error_within_bit_width_bound_and_alltoall_no_worse_than_ring(run):
    world_size, results = run
    codec = cp.get_codec("int8")
    for rank, outputs in enumerate(results):
        for chunk in CHUNKS:
            exact, parts = exact_sum_and_parts(rank, world_size, chunk)
            others = [part for r, part in enumerate(parts) if r != rank]
            # alltoall: one quantization of each other rank's contribution.
            alltoall_bound = sum(codec.error_bound(part.float()).double() for part in others)
            # ring: n - 1 quantizations of partial sums, each bounded by the sum of |parts|.
            magnitude = sum(part.abs() for part in parts).float()
            ring_bound = (world_size - 1) * codec.error_bound(magnitude).double() * 1.01
            errors = {}
            for algorithm in COMPRESSED:
                error = outputs[("int8", algorithm, chunk)].double() - exact
                bound = alltoall_bound if algorithm == "alltoall" else ring_bound
                assert torch.all(error.abs() <= bound + 1e-6), (algorithm, chunk)
                errors[algorithm] = error.norm().item()
            # Beyond quantization, the two differ only by fp32 summation order.
            summation_slack = world_size * 2.0**-24 * exact.norm().item()
            assert errors["alltoall"] <= errors["ring"] + summation_slack, errors


def test_all_reduce(run):
    world_size, results = run
    codec = cp.get_codec("int8")
    for numel in (7, 1001):
        exact = sum(contribution(r, numel).double() for r in range(world_size))
        for algorithm in COMPRESSED:
            lossy_outputs = []
            for outputs in results:
                native, exact_none, lossy = outputs[("all_reduce", algorithm, numel)]
                assert torch.equal(exact_none, native), (algorithm, numel)
                lossy_outputs.append(lossy)
            if algorithm != "ring-hop":  # ring-hop re-encodes at every hop by design
                for other in lossy_outputs[1:]:
                    assert torch.equal(other, lossy_outputs[0]), (algorithm, numel)
            magnitude = sum(contribution(r, numel).abs() for r in range(world_size))
            bound = world_size * codec.error_bound(magnitude).double() * 1.01
            for lossy in lossy_outputs:
                assert torch.all((lossy.double() - exact).abs() <= bound), (algorithm, numel)


def _small_values_all_reduced(rank, world_size):
    small = contribution(rank, 7) * 1e-4  # 7: one of the 8 padded elements is padding
    results = {}
    for algorithm in COMPRESSED:
        all_reduce(torch.full((8,), 1e3), codec="int8", algorithm=algorithm)  # in the workspace
        results[algorithm] = small.clone()
        all_reduce(results[algorithm], codec="int8", algorithm=algorithm)
    return results


def test_all_reduce_padding_leaves_small_values_their_precision():
    """all_reduce pads the tensor to whole chunks with zeros: padding of any other value (or
    a previous call's values left in the workspace) is summed and encoded in the last
    block with the real values, and its absmax rounds values much smaller than it to zero
    (padding of 1 passed test_all_reduce, whose values are large enough to hide it)."""
    world_size = 2
    codec = cp.get_codec("int8")
    parts = [contribution(r, 7) * 1e-4 for r in range(world_size)]
    exact = sum(part.double() for part in parts)
    bound = world_size * codec.error_bound(sum(part.abs() for part in parts)).double() * 1.01
    for results in run_distributed(_small_values_all_reduced, world_size):
        for algorithm, result in results.items():
            assert torch.all((result.double() - exact).abs() <= bound), algorithm


def _bad_arguments(rank, world_size):
    if rank != 0:  # the peer never enters a collective: a call that communicated would hang
        return None
    with forbid_communication() as attempted:
        errors = _bad_argument_errors()
    assert attempted == []
    return errors


def _bad_argument_errors():
    errors = []
    calls = [
        lambda: reduce_scatter_tensor(torch.zeros(5), torch.zeros(9)),
        lambda: reduce_scatter_tensor(torch.zeros(5), torch.zeros(10), op=dist.ReduceOp.MAX),
        lambda: reduce_scatter_tensor(torch.zeros(5), torch.zeros(10), chunk_bytes=0),
        lambda: reduce_scatter_tensor(torch.zeros(5), torch.zeros(10), algorithm="tree"),
        lambda: all_reduce(torch.zeros(1).expand(4)),
    ]
    for call in calls:
        try:
            call()
        except ValueError as error:
            errors.append(str(error))
    return errors


def test_bad_arguments_raise_before_any_communication():
    errors = run_distributed(_bad_arguments, 2)[0]
    assert len(errors) == 5
    assert "(5,)" in errors[0] and "(9,)" in errors[0] and "world_size=2" in errors[0]
    assert "SUM or ReduceOp.AVG" in errors[1]
    assert "chunk_bytes" in errors[2]
    assert "unknown algorithm 'tree'" in errors[3] and errors[3].endswith("'auto')")
    assert "tensor has elements that share memory" in errors[4]


def _strided(rank, world_size):
    """Reductions of strided tensors by every algorithm (native's asynchronous), and torch's
    of contiguous copies (torch's gloo all_reduce of ``t[::2]`` sums ``t[:n]`` instead)."""
    inp = contribution(rank, 1200, torch.float32)[::2]
    out = torch.empty(600 // world_size)
    dist.reduce_scatter_tensor(out, inp.contiguous())
    summed = contribution(rank, 600, torch.float32).view(20, 30)
    expected_sum = summed.clone()
    dist.all_reduce(expected_sum)
    same = {}
    for algorithm in ("native", *COMPRESSED):
        call = dict(codec="none", algorithm=algorithm, async_op=algorithm == "native")
        strided_out = torch.zeros(2 * out.numel())
        works = [reduce_scatter_tensor(strided_out[::2], inp, **call)]
        transposed = summed.t().clone().t()
        works.append(all_reduce(transposed, **call))
        every_other = torch.zeros(1200)
        every_other[::2] = summed.view(-1)
        works.append(all_reduce(every_other[::2], **call))
        for work in works:
            if work is not None:
                work.wait()
        same[algorithm] = (
            torch.equal(strided_out[::2], out)
            and not strided_out[1::2].any()
            and torch.equal(transposed, expected_sum)
            and torch.equal(every_other[::2], expected_sum.view(-1))
            and not every_other[1::2].any()
        )
    return same


def test_strided_tensors_reduce_as_torch_reduces_contiguous_ones():
    """They were refused ("must be contiguous"), while torch takes them."""
    for same in run_distributed(_strided, 2):
        assert all(same.values()), same


def _nan_in_one_contribution(rank, world_size):
    inp = contribution(rank, 400 * world_size)
    if rank == 2:
        inp[400 * 1 + 17] = float("nan")  # lands in rank 1's chunk
    results = {}
    for algorithm in COMPRESSED:
        out = torch.empty(400)
        reduce_scatter_tensor(out, inp, codec="int8", algorithm=algorithm)
        reduced = inp.clone()
        all_reduce(reduced, codec="int8", algorithm=algorithm)
        results[algorithm] = (out, reduced)
    return results


def test_nan_propagates_through_reduce_scatter_and_all_reduce():
    results = run_distributed(_nan_in_one_contribution, 3)
    for algorithm in COMPRESSED:
        assert torch.isnan(results[1][algorithm][0][17]), algorithm
        for rank in (0, 2):
            assert torch.isfinite(results[rank][algorithm][0]).all(), (algorithm, rank)
        for rank in range(3):
            assert torch.isnan(results[rank][algorithm][1][400 + 17]), (algorithm, rank)


def _fp16_average_whose_sum_overflows(rank, world_size):
    results = {}
    for algorithm in ("native", *COMPRESSED):
        for codec in ("none", "fp16", "int8"):
            out = torch.empty(300, dtype=torch.float16)
            inp = torch.full((300 * world_size,), 60000.0, dtype=torch.float16)
            reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG, codec=codec, algorithm=algorithm)
            reduced = inp.clone()
            all_reduce(reduced, op=dist.ReduceOp.AVG, codec=codec, algorithm=algorithm)
            results[algorithm, codec] = (out, reduced)
    return results


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_fp16_average_whose_sum_overflows_fp16_is_finite_unless_partial_sums_travel_in_fp16(
    world_size,
):
    """docs/codecs.md: torch's gloo sums fp16 in fp16 (Inf); the compressed paths sum in fp32 and
    give the average, but for a ring with fp16 partial sums on the wire (3 ranks or more)."""
    for results in run_distributed(_fp16_average_whose_sum_overflows, world_size):
        for (algorithm, codec), reduced in results.items():
            in_fp16 = algorithm == "native" or (
                world_size > 2 and algorithm != "alltoall" and codec in ("none", "fp16")
            )
            expected = torch.inf if in_fp16 else 60000.0
            for tensor in reduced:
                assert (tensor == expected).all(), (algorithm, codec, tensor[0].item())


def _negative_zeros_reduced(rank, world_size):
    results = {}
    for dtype in DTYPES:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            for algorithm in ("native", *COMPRESSED, "backend"):
                out = torch.empty(300, dtype=dtype)
                inp = torch.full((300 * world_size,), -0.0, dtype=dtype)
                reduce_scatter_tensor(out, inp, op=op, codec="none", algorithm=algorithm)
                reduced = torch.full((301,), -0.0, dtype=dtype)
                all_reduce(reduced, op=op, codec="none", algorithm=algorithm)
                results[dtype, str(op), algorithm] = (out, reduced)
    return results


def test_negative_zeros_reduce_to_negative_zero_through_none_as_through_torch():
    for results in run_distributed(_negative_zeros_reduced, 3):
        for key, (out, reduced) in results.items():
            assert torch.signbit(out).all() and (out == 0).all(), key
            assert torch.signbit(reduced).all() and (reduced == 0).all(), key


def _error_feedback(rank, world_size, algorithm):
    numel = 3 * 1000
    generator = torch.Generator().manual_seed(rank)
    residual = torch.zeros(numel)
    history = []
    for _ in range(2):
        inp = torch.randn(numel, generator=generator)
        before = residual.clone()
        out = torch.empty(numel // world_size)
        reduce_scatter_tensor(out, inp, codec="int8", algorithm=algorithm, residual=residual)
        history.append((inp, before, residual.clone(), out))
    try:
        reduce_scatter_tensor(
            torch.empty(1000), torch.empty(numel), residual=residual, algorithm="ring"
        )
    except ValueError as error:
        return history, str(error)
    return history, None


@pytest.mark.parametrize("algorithm", ERROR_FEEDBACK_ALGORITHMS)
def test_error_feedback_residual_holds_exactly_what_the_encoding_lost(algorithm):
    """``inp + residual_before == sent + residual_after``: summing what was sent reproduces
    the output, and the own chunk is never encoded (its residual stays zero)."""
    world_size = 3
    results = run_distributed(_error_feedback, world_size, algorithm, timeout=120)
    histories = [history for history, _ in results]
    assert "residual (error feedback) needs algorithm='alltoall' or 'backend'" in results[0][1]
    chunk = 1000
    for step in range(2):
        for rank in range(world_size):
            part = slice(rank * chunk, (rank + 1) * chunk)
            sent = []
            for source in range(world_size):
                inp, before, after, _ = histories[source][step]
                value = inp[part].double() + before[part].double() - after[part].double()
                sent.append(value)
                if source == rank:
                    assert torch.equal(after[part], torch.zeros(chunk))
            out = histories[rank][step][3].double()
            magnitude = sum(s.abs() for s in sent)
            assert (
                (out - sum(sent)).abs() <= 4 * (world_size - 1) * 2.0**-24 * magnitude + 1e-6
            ).all()
            # each residual is an int8 rounding error: at most absmax/254 of its block
            inp, before, after, _ = histories[rank][step]
            assert after.abs().max() <= (inp + before).abs().max() / 254 * 1.001


def _error_feedback_after_a_non_finite_step(rank, world_size):
    numel = world_size * 1000
    generator = torch.Generator().manual_seed(rank)
    residual, out = torch.zeros(numel), torch.empty(1000)
    bad = torch.randn(numel, generator=generator)
    bad[5], bad[1000 + 5] = float("inf"), float("nan")
    steps = []
    for inp in (
        bad,
        torch.randn(numel, generator=generator),
        torch.randn(numel, generator=generator),
    ):
        cp.reduce_scatter_tensor(out, inp, codec="int8", algorithm="alltoall", residual=residual)
        steps.append((out.isfinite().all().item(), residual.isfinite().all().item()))
        if len(steps) == 1:
            after_the_bad_step = residual.clone()
    return steps, after_the_bad_step


def test_one_non_finite_step_does_not_poison_the_error_feedback_of_later_steps():
    """The overflow reaches the output of its own step (chunks 0 and 1 hold it); the next
    clean steps end finite, and so does the residual. Before, the residual kept the NaN
    block and every later output of that block was NaN. Only the bad value's block of 256
    restarts: the rest of its chunk keeps its rounding error (not the whole residual
    zeroed)."""
    results = run_distributed(_error_feedback_after_a_non_finite_step, 2)
    for rank, (steps, residual) in enumerate(results):
        assert steps[0][0] is False, rank  # propagated, never replaced
        assert steps[1:] == [(True, True), (True, True)], rank
        sent = residual[(1 - rank) * 1000 : (2 - rank) * 1000]  # the chunk this rank encodes
        assert torch.equal(sent[:256], torch.zeros(256)), rank  # the bad value's block
        assert (sent[256:] != 0).sum() > 500, rank


def _empty(rank, world_size):
    finished = []
    for algorithm in ("ring", "ring-hop", "alltoall"):
        cp.reduce_scatter_tensor(torch.empty(0), torch.empty(0), codec="int8", algorithm=algorithm)
        finished.append(algorithm)
    return finished


def test_an_empty_reduce_scatter_works_with_every_algorithm():
    """ring-hop once cut an empty chunk into pieces of 0 elements (range step 0)."""
    for finished in run_distributed(_empty, 2, timeout=60):
        assert finished == ["ring", "ring-hop", "alltoall"]


def _alltoall_posts(rank, world_size, codec, chunk):
    """Every point-to-point post of one ``alltoall`` reduce-scatter on gloo, in order:
    ``(kind, peer, bytes)``; and its output against the sum of the contributions."""
    inp = contribution(rank, chunk * world_size, integers=True)
    out = torch.empty(chunk)
    with recorded_posts() as posted:
        cp.reduce_scatter_tensor(out, inp, codec=codec, algorithm="alltoall")
    mine = [contribution(r, chunk * world_size, integers=True).view(world_size, chunk)[rank]
            for r in range(world_size)]  # fmt: skip
    return posted, out, mine


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_large_alltoall_on_gloo_posts_every_receive_before_any_send(world_size):
    """gloo's own all-to-all posts each peer's send before its receive, and gloo
    serialises an exchange whose sends are posted first: on two emulated hosts it took up
    to 1.8x as long (``benchmarks/alltoall_p2p_2026-12-07/``). From
    ``POINT_TO_POINT_FROM_BYTES`` per peer the payloads go point to point
    instead, every receive posted before any send (after the argument check's header,
    which travels alone), one to and from each peer; below it, gloo's own."""
    codec = get_codec("int8")
    large = 300_000
    threshold = executor.POINT_TO_POINT_FROM_BYTES
    assert (
        codec.wire_bytes(1000, torch.float32) < threshold <= codec.wire_bytes(large, torch.float32)
    )
    for chunk in (large, 1000):
        wire = codec.wire_bytes(chunk, torch.float32)
        for rank, (posted, out, mine) in enumerate(
            run_distributed(_alltoall_posts, world_size, "int8", chunk, timeout=60)
        ):
            expected = sum(mine)
            bound = sum(codec.error_bound(x) for x in mine)  # one rounding per contribution
            assert bool(((out - expected).abs() <= bound).all())
            assert (bound < expected.abs() / 2).float().mean() > 0.9  # zeroed or negated fails
            payloads = [(kind, peer) for kind, peer, size in posted if size == wire]
            if chunk < large:
                assert payloads == [], posted  # below the threshold: gloo's own all-to-all
                continue
            peers = sorted(p for p in range(world_size) if p != rank)
            kinds = [kind for kind, _ in payloads]
            assert kinds == ["receive"] * len(peers) + ["send"] * len(peers), posted
            assert sorted(peer for kind, peer in payloads if kind == "send") == peers
            assert sorted(peer for kind, peer in payloads if kind == "receive") == peers
        for _, out, mine in run_distributed(_alltoall_posts, world_size, "none", chunk, timeout=60):
            assert torch.equal(out, sum(mine))  # small integers: exact


def _alltoall_events(rank, world_size, chunk_bytes):
    """The order in which an ``alltoall`` in pieces posts its exchanges (point to point at
    every size) and sums what arrived: ``("post", piece)`` and ``("sum", piece)``."""
    from commpress.collectives import payloads
    from commpress.transport import p2p

    events = []
    post_each, handle = p2p.post_each, payloads.Contributions.handle

    def posting(group, sends, receives, tag):
        if len(receives) == world_size - 1:  # an exchange, not the check's header
            events.append(("post", sum(1 for e in events if e[0] == "post")))
        return post_each(group, sends, receives, tag)

    def summing(self, receive):
        events.append(("sum", receive.piece))
        return handle(self, receive)

    executor.POINT_TO_POINT_FROM_BYTES = 0
    p2p.post_each, payloads.Contributions.handle = posting, summing
    try:
        inp = contribution(rank, 3000 * world_size, integers=True)
        out = torch.empty(3000)
        cp.reduce_scatter_tensor(out, inp, codec="none", algorithm="alltoall",
                                 chunk_bytes=chunk_bytes)  # fmt: skip
    finally:
        p2p.post_each, payloads.Contributions.handle = post_each, handle
    expected = sum(contribution(r, 3000 * world_size, integers=True).view(world_size, -1)[rank]
                   for r in range(world_size))  # fmt: skip
    return events, torch.equal(out, expected)


def test_alltoall_sums_a_piece_while_the_next_one_is_on_the_wire():
    """Pieces of 1024 elements (``chunk_bytes=4096``): three exchanges. The first piece's
    sums come once the second exchange is posted (here the third too: two in flight while
    it sums), in piece order; one piece (the whole slice) posts once, then sums."""
    for events, exact in run_distributed(_alltoall_events, 3, 4096, timeout=60):
        assert exact
        assert events.index(("sum", 0)) > events.index(("post", 1)), events
        # two exchanges in flight (executor.PIECES_IN_FLIGHT): with one, the first piece's
        # sums came before the third exchange was posted
        assert events.index(("sum", 0)) > events.index(("post", 2)), events
        assert [e for e in events if e[0] == "sum"] == [("sum", p) for p in (0, 0, 1, 1, 2, 2)]
    for events, exact in run_distributed(_alltoall_events, 3, 1 << 30, timeout=60):
        assert exact and events == [("post", 0), ("sum", 0), ("sum", 0)], events


def _alltoall_with_feedback(rank, world_size, chunk_bytes):
    inp = torch.randn(1000 * world_size, generator=torch.Generator().manual_seed(rank))
    residual = torch.randn(1000 * world_size, generator=torch.Generator().manual_seed(9)) / 100
    outputs = []
    for _ in range(2):  # the second call encodes with the residual the first left
        out = torch.empty(1000)
        cp.reduce_scatter_tensor(out, inp, codec="int8:stochastic=1", algorithm="alltoall",
                                 chunk_bytes=chunk_bytes, residual=residual)  # fmt: skip
        outputs.append(out)
    return outputs, residual


def test_alltoall_in_pieces_gives_the_bits_of_whole_slices():
    """Pieces of 256 elements (the last of 232) against one piece per slice: the same
    outputs and error-feedback residuals, bit for bit, stochastic rounding included (its
    noise drawn slice by slice either way)."""
    pieces = run_distributed(_alltoall_with_feedback, 3, 1024, timeout=60)
    whole = run_distributed(_alltoall_with_feedback, 3, 1 << 30, timeout=60)
    for (outputs, residual), (whole_outputs, whole_residual) in zip(pieces, whole, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(outputs, whole_outputs, strict=True))
        assert torch.equal(residual, whole_residual)
        assert not torch.equal(outputs[0], outputs[1])  # the residual changed the second
