"""Low-rank operators and algorithms in one process, against float64 references."""

from __future__ import annotations

import pytest
import torch

from commpress.lowrank import ACPSGD, PowerSGD, as_matrix, get_algorithm, orthogonalize
from commpress.lowrank.operators import ORTHOGONALIZATIONS, group_by_shape
from commpress.lowrank.reducer import LowRankStats


def batch_of(b, n, r, seed=0, dtype=torch.float32):
    return torch.randn(b, n, r, generator=torch.Generator().manual_seed(seed)).to(dtype)


def projector(q: torch.Tensor) -> torch.Tensor:
    q = q.double()
    return q @ q.transpose(1, 2)


@pytest.mark.parametrize("method", ORTHOGONALIZATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_orthogonalize_matches_float64_householder(method, dtype):
    matrices = batch_of(5, 40, 4, dtype=dtype)
    q = orthogonalize(matrices, method)
    assert q.dtype == torch.float32 and q.shape == matrices.shape
    identity = torch.eye(4, dtype=torch.float64).expand(5, 4, 4)
    torch.testing.assert_close(q.double().transpose(1, 2) @ q.double(), identity, atol=1e-5, rtol=0)
    reference, _ = torch.linalg.qr(matrices.double(), mode="reduced")
    torch.testing.assert_close(projector(q), projector(reference), atol=1e-5, rtol=0)


def test_cholesky_falls_back_when_the_gram_matrix_is_ill_conditioned():
    matrices = batch_of(3, 50, 3)
    matrices[1, :, 2] = matrices[1, :, 1] + 1e-6 * matrices[1, :, 0]  # nearly dependent
    q = orthogonalize(matrices, "cholesky")
    assert torch.isfinite(q).all()
    identity = torch.eye(3).expand(3, 3, 3)
    torch.testing.assert_close(q.transpose(1, 2) @ q, identity, atol=1e-4, rtol=0)


@pytest.mark.parametrize("method", ["gram-schmidt", "householder"])
def test_a_zero_column_stays_zero(method):
    matrices = batch_of(2, 10, 3)
    matrices[0, :, 1] = 0
    q = orthogonalize(matrices, method)
    assert torch.equal(q[0, :, 1], torch.zeros(10))


@pytest.mark.parametrize("method", ORTHOGONALIZATIONS)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("column", [0, 1])
def test_nan_and_inf_propagate_through_orthogonalization(method, value, column):
    matrices = batch_of(2, 10, 2)
    matrices[0, 3, column] = value
    q = orthogonalize(matrices, method)
    assert not torch.isfinite(q[0]).all() and torch.isfinite(q[1]).all()


@pytest.mark.parametrize(
    ("args", "message"),
    [((batch_of(1, 4, 2), "qr"), "unknown orthogonalization"),
     ((torch.ones(4, 2),), "batch"),
     ((batch_of(1, 2, 3),), "cannot orthogonalize 3 columns in 2")],
)  # fmt: skip
def test_orthogonalize_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        orthogonalize(*args)


def test_gradients_as_matrices():
    assert as_matrix(torch.zeros(8, 3, 3, 3)).shape == (8, 27)
    assert as_matrix(torch.zeros(5, 7)).shape == (5, 7)
    assert as_matrix(torch.zeros(7)) is None
    groups = group_by_shape([torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, 3)])
    assert groups == {(2, 3): [0, 2], (4, 3): [1]}


def simulate(algorithm, per_rank: list[torch.Tensor], factors, step=0) -> torch.Tensor:
    """One compressed step of ``algorithm`` over simulated ranks: sums stand for all-reduce."""
    world_size = len(per_rank)
    states = [{k: v.clone() for k, v in factors.items()} for _ in per_rank]
    for round_ in range(algorithm.rounds(step)):
        parts = [
            algorithm.factor(round_, step, m, s) for m, s in zip(per_rank, states, strict=True)
        ]
        total = sum(parts)
        for state in states:
            algorithm.absorb(round_, step, total.clone(), state, world_size)
    outputs = []
    for state in states:
        left, right = algorithm.reconstruct(step, state)
        outputs.append(left @ right.transpose(1, 2))
    for output in outputs[1:]:
        assert torch.equal(output, outputs[0])  # every rank reconstructs the same
    return outputs[0]


@pytest.mark.parametrize("shape", [(12, 5), (5, 12)])
def test_powersgd_at_full_rank_reconstructs_the_average(shape):
    n, m = shape
    per_rank = [batch_of(2, n, m, seed=s) for s in range(3)]
    algorithm = PowerSGD(rank=min(n, m))
    factors = {"q": torch.randn(2, m, min(n, m), generator=torch.Generator().manual_seed(9))}
    result = simulate(algorithm, per_rank, factors)
    torch.testing.assert_close(result, sum(per_rank) / 3, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("shape", "step"), [((12, 5), 0), ((5, 12), 1)])
def test_acpsgd_at_full_rank_reconstructs_the_average(shape, step):
    """Exact when the kept factor spans its whole side: Q (m <= rank) on even steps, P
    (n <= rank) on odd steps."""
    n, m = shape
    per_rank = [batch_of(2, n, m, seed=s) for s in range(3)]
    generator = torch.Generator().manual_seed(9)
    factors = {
        "p": torch.randn(2, n, 5, generator=generator),
        "q": torch.randn(2, m, 5, generator=generator),
    }
    result = simulate(ACPSGD(rank=5), per_rank, factors, step)
    torch.testing.assert_close(result, sum(per_rank) / 3, atol=1e-4, rtol=1e-4)


def textbook_powersgd(per_rank: list[torch.Tensor], q: torch.Tensor) -> torch.Tensor:
    """Vogels et al., Algorithm 1, for one matrix, written plainly in float64."""
    p = sum(m @ q for m in per_rank)
    columns = []
    for j in range(p.shape[1]):  # Gram-Schmidt
        v = p[:, j].clone()
        for u in columns:
            v -= (u @ v) * u
        columns.append(v / v.norm())
    p_hat = torch.stack(columns, dim=1)
    q_new = sum(m.T @ p_hat for m in per_rank) / len(per_rank)
    return p_hat @ q_new.T


def test_powersgd_step_equals_the_textbook_given_the_same_q():
    per_rank = [batch_of(1, 30, 20, seed=s) for s in range(4)]
    q = torch.randn(1, 20, 3, generator=torch.Generator().manual_seed(5))
    ours = simulate(PowerSGD(rank=3), per_rank, {"q": q})
    reference = textbook_powersgd([m[0].double() for m in per_rank], q[0].double())
    torch.testing.assert_close(ours[0].double(), reference, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("powersgd:rank=0", "rank must be an int of at least 1"), ("topk", "unknown low-rank"),
     ("acpsgd:rank=x", r"rank='x' in spec 'acpsgd:rank=x' must be an int"),
     ("powersgd:depth=2", "unknown option 'depth' for algorithm 'powersgd'"),
     ("powersgd:warm_start=maybe", "must be true or false"), ("powersgd:rank", "key=value"),
     ("powersgd:orthogonalization=lu", "unknown orthogonalization")],
)  # fmt: skip
def test_bad_algorithm_specs_are_value_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        get_algorithm(spec)


def test_algorithm_specs_set_every_kind_of_option():
    algorithm = get_algorithm(
        "acpsgd:rank=8,start_iter=0,min_compression_rate=1.5,warm_start=false,"
        "error_feedback=no,orthogonalization=cholesky"
    )
    assert isinstance(algorithm, ACPSGD) and algorithm.rank == 8 and algorithm.start_iter == 0
    assert algorithm.min_compression_rate == 1.5 and algorithm.orthogonalization == "cholesky"
    assert algorithm.warm_start is False and algorithm.error_feedback is False


def test_what_is_worth_compressing():
    algorithm = PowerSGD(rank=4)
    assert algorithm.compresses(256, 256)
    assert not algorithm.compresses(256, 4)  # rank not below the smaller side
    assert not algorithm.compresses(12, 12)  # factors 96 values vs 144: rate 1.5 < 2


def test_what_is_worth_compressing_is_what_torchs_powersgd_hook_compresses():
    """``torch-powersgd`` is compared with ``powersgd`` of the same options: a matrix at
    the rate exactly (8 x 8 at rank 2, rate 2) was compressed by ours and not by torch's,
    whose comparison is strict, and so is its arithmetic's rounding (11 x 44, rank 4, 2.2)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    differ = []
    for rate in (1.0, 1.5, 2.0, 2.2, 2.5, 3.0, 10 / 3, 7.1):
        for rank in (1, 2, 3, 4, 8):
            algorithm = PowerSGD(rank=rank, min_compression_rate=rate)
            for n, m in [(n, m) for n in range(1, 48) for m in range(1, 48)] + [(11, 44)]:
                torchs, _, _ = _should_compress(n, m, min(n, m, rank), rate)
                if algorithm.compresses(n, m) != torchs:
                    differ.append((n, m, rank, rate, torchs))
    assert not differ
    assert not PowerSGD(rank=2).compresses(8, 8)


def test_batched_products_match_float64():
    from commpress.lowrank.operators import times, transposed_times

    matrices, right, left = (
        batch_of(3, 20, 12, seed=1),
        batch_of(3, 12, 4, seed=2),
        batch_of(3, 20, 4, seed=3),
    )
    torch.testing.assert_close(
        times(matrices, right).double(), matrices.double() @ right.double(), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(
        transposed_times(matrices, left).double(),
        matrices.double().transpose(1, 2) @ left.double(),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("method", ORTHOGONALIZATIONS)
@pytest.mark.parametrize("scale", [1e-13, 1e-25])
def test_tiny_matrices_are_orthogonalized_as_their_scaled_up_selves(method, scale):
    """Gram-Schmidt took fp32 norms, whose squares underflow below about 1e-19: columns of
    1e-25 stayed unnormalized (PowerSGD's P scales as the gradient squared)."""
    matrices = batch_of(2, 20, 3)
    reference = orthogonalize(matrices, method)
    tiny = orthogonalize(matrices * scale, method)
    identity = torch.eye(3).expand(2, 3, 3)
    torch.testing.assert_close(tiny.transpose(1, 2) @ tiny, identity, atol=1e-5, rtol=0)
    torch.testing.assert_close(projector(tiny), projector(reference), atol=1e-5, rtol=0)


def test_a_tensor_without_elements_is_not_a_matrix():
    """``Linear(16, 0)``'s weight: ``reshape(0, -1)`` raised inside backward."""
    assert as_matrix(torch.zeros(0, 16)) is None and as_matrix(torch.zeros(16, 0)) is None


@pytest.mark.parametrize("algorithm", [PowerSGD, ACPSGD])
def test_a_zero_column_of_a_kept_factor_is_drawn_afresh_the_same_way_every_time(algorithm):
    alg = algorithm(rank=3)
    factor = batch_of(2, 10, 3)
    factor[1, :, 2] = 0
    identities = [("name", "a"), ("name", "b")]
    revived = alg.revived(factor, identities, step=5)
    assert torch.equal(revived[0], factor[0]) and torch.equal(revived[1, :, :2], factor[1, :, :2])
    assert revived[1, :, 2].abs().min() > 0
    assert torch.equal(revived, alg.revived(factor, identities, step=5))
    assert not torch.equal(revived, alg.revived(factor, identities, step=6))
    clean = batch_of(2, 10, 3)
    assert alg.revived(clean, identities, step=5) is clean


@pytest.mark.parametrize("algorithm", [PowerSGD, ACPSGD])
def test_a_zero_column_is_revived_by_its_matrix_identity_whatever_its_place(algorithm):
    """Revived columns were drawn for the batch at once, each by its place in it."""
    alg = algorithm(rank=3)
    factor = batch_of(2, 10, 3)
    factor[:, :, 1] = 0
    a, b = ("name", "a"), ("name", "b")
    in_order = alg.revived(factor, [a, b], step=5)
    swapped = alg.revived(factor[[1, 0]], [b, a], step=5)
    assert torch.equal(in_order, swapped[[1, 0]])
    assert not torch.equal(in_order[0, :, 1], in_order[1, :, 1])
    alone = alg.revived(factor[1:], [b], step=5)
    assert torch.equal(alone[0], in_order[1])
    # a draw of its own: not the numbers warm_start=False draws at that step
    fresh = alg.draw([a, b], (10, 3), step=5)
    assert not torch.equal(in_order[:, :, 1], fresh[:, :, 1])


@pytest.mark.parametrize("algorithm", [PowerSGD, ACPSGD])
def test_each_matrix_draws_by_its_identity_whatever_batch_it_is_in(algorithm):
    """Fresh draws came for a batch at once, seeded by the step alone: a matrix drew other
    numbers at another place in its batch (DDP's first buckets against its rebuilt ones: a
    resumed run's first step), and two batches of one shape drew the same numbers."""
    alg = algorithm(rank=3, seed=7)
    a, b, c = ("name", "a"), ("name", "b"), ("unnamed", 0)
    together = alg.draw([a, b, c], (10, 3), step=4)
    for position, identity in enumerate((a, b, c)):
        alone = alg.draw([identity], (10, 3), step=4)
        assert torch.equal(alone[0], together[position])
    assert torch.equal(alg.draw([c, a], (10, 3), step=4), together[[2, 0]])
    assert not torch.equal(together[0], together[1])
    for other in (alg.draw([a], (10, 3), step=5), alg.draw([a], (10, 3), step=4, purpose=1)):
        assert not torch.equal(other[0], together[0])
    assert not torch.equal(algorithm(rank=3, seed=8).draw([a], (10, 3), step=4)[0], together[0])


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"error_feedback": "no"}, TypeError, "error_feedback must be True or False"),
        ({"warm_start": None}, TypeError, "warm_start must be True or False"),
        ({"seed": None}, TypeError, "seed must be an int"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"seed": True}, TypeError, "seed must be an int"),
        ({"seed": 1 << 63}, ValueError, r"seed must be in \[0, 2\*\*63\)"),
        ({"seed": -1}, ValueError, "seed must be in"),
        ({"min_compression_rate": "2"}, TypeError, "min_compression_rate must be a number"),
    ],
)
@pytest.mark.parametrize("algorithm", [PowerSGD, ACPSGD])
def test_bad_options_are_refused_naming_them(algorithm, options, error, message):
    with pytest.raises(error, match=message):
        algorithm(**options)


def test_a_seed_near_the_largest_draws_without_overflow():
    """``seed * 1_000_003 + step`` overflowed the generator's seed from 2**44 on."""
    alg = PowerSGD(seed=(1 << 63) - 1, warm_start=False)
    assert alg.draw([("name", "w")], (4, 2), step=7).shape == (1, 4, 2)


def test_a_reducer_refuses_a_group_that_is_not_one():
    from commpress.lowrank import Reducer

    with pytest.raises(TypeError, match="group must be a torch.distributed.ProcessGroup"):
        Reducer(PowerSGD(), group="x")


def test_a_reducer_refuses_a_key_given_twice():
    """Two gradients under one key shared one state."""
    from commpress.lowrank import Reducer

    gradient = torch.zeros(8, 8)
    with pytest.raises(ValueError, match="keys 'w' given twice"):
        Reducer(PowerSGD()).plan([("w", gradient), ("w", gradient)])


def dependent_columns(b: int, n: int, r: int, spread: float, seed: int = 0) -> torch.Tensor:
    """``r`` columns within ``spread`` of one shared column: a P of a nearly rank-1 gradient."""
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(b, n, 1, generator=generator)
    return shared + spread * torch.randn(b, n, r, generator=generator)


@pytest.mark.parametrize("method", ORTHOGONALIZATIONS)
@pytest.mark.parametrize("spread", [1e-2, 1e-3, 1e-5, 1e-7, 0.0])
def test_nearly_dependent_columns_come_out_orthonormal(method, spread):
    """One Gram-Schmidt projection left columns within 1e-3 of each other at cosines near
    1; Cholesky-QR kept such matrices (its Cholesky factor's diagonal ratio stayed under
    1e3) and returned columns off from orthonormal by 0.6. Columns that only rounding sets
    apart may come out zero (they span nothing new)."""
    matrices = dependent_columns(8, 200, 4, spread)
    q = orthogonalize(matrices, method)
    gram = q.transpose(1, 2) @ q
    lengths = torch.diagonal(gram, dim1=1, dim2=2)
    assert torch.equal(lengths.round(), torch.ones_like(lengths)) or spread < 1e-4
    torch.testing.assert_close(gram, torch.diag_embed(lengths.round()), atol=1e-4, rtol=0)
    spanned = q @ (q.transpose(1, 2) @ matrices)
    assert ((spanned - matrices).norm(dim=1) <= 1e-3 * matrices.norm(dim=1)).all()


@pytest.mark.parametrize("method", ORTHOGONALIZATIONS)
@pytest.mark.parametrize("gradient_rank", [1, 2, 3])
def test_powersgd_reconstructs_a_gradient_of_lower_rank_exactly(method, gradient_rank):
    """A rank-1 gradient (a linear layer's at batch size 1) compressed at rank 4 came back
    up to 2.8 times its own norm away from itself with Gram-Schmidt."""
    generator = torch.Generator().manual_seed(gradient_rank)
    for _ in range(10):
        left = torch.randn(1, 64, gradient_rank, generator=generator)
        matrix = left @ torch.randn(1, gradient_rank, 48, generator=generator)
        q = torch.randn(1, 48, 4, generator=generator)
        result = simulate(PowerSGD(rank=4, orthogonalization=method), [matrix], {"q": q})
        assert (result - matrix).norm() <= 1e-3 * matrix.norm()


@pytest.mark.parametrize("method", ORTHOGONALIZATIONS)
@pytest.mark.parametrize("shape", [(2, 10, 0), (0, 10, 3), (2, 0, 0)])
def test_batches_without_elements_are_orthogonalized_as_they_are(method, shape):
    """Cholesky-QR raised an IndexError from ``min()`` for matrices without columns."""
    q = orthogonalize(torch.zeros(shape), method)
    assert q.shape == shape and q.dtype == torch.float32


@pytest.mark.parametrize(
    "gradients",
    [[torch.zeros(2, 8)], {"ab": torch.zeros(8, 8)}, torch.zeros(2, 8), [("w", torch.zeros(2), 1)]],
    ids=["a tensor for a pair", "a dict", "a tensor", "a triple"],
)
def test_a_reducer_refuses_gradients_that_are_not_key_tensor_pairs(gradients):
    """``[grad]`` of a 2-row gradient was taken as the pair (row 0, row 1): row 1 averaged
    under row 0 as its key, row 0 left alone; a dict gave "gradient 'a' must be..."."""
    from commpress.lowrank import Reducer

    with pytest.raises(TypeError, match=r"gradients must be \(key, tensor\) pairs"):
        Reducer(PowerSGD()).plan(gradients)


def test_uncompressed_bytes_are_counted_in_each_gradients_own_dtype():
    """DDP all-reduces bf16 gradients as bf16: counting them as fp32 made every bf16
    model's compression ratio look twice as good as it is."""
    stats = LowRankStats()
    stats.count_raw([torch.zeros(100, dtype=torch.bfloat16), torch.zeros(5, 10)], world_size=4)
    assert stats.raw_bytes == 100 * 2 + 50 * 4
    # a ring all-reduce sends 2(n - 1) chunks of ceil(numel / n) elements
    assert stats.raw_wire_bytes == 2 * 3 * 25 * 2 + 2 * 3 * 13 * 4


@pytest.mark.parametrize("apart", [1e-4, 1e-5])
def test_a_small_independent_part_is_kept_as_a_direction(apart):
    """Gram-Schmidt zeroed a column whose part outside the columns before it was under
    1e-4 of its norm: a thousand times fp32 rounding, so real signal was dropped where the
    other methods keep it."""
    generator = torch.Generator().manual_seed(7)
    a, b = torch.linalg.qr(torch.randn(200, 2, generator=generator))[0].T
    matrices = torch.stack([a, a + apart * b], dim=1).unsqueeze(0)
    for method in ORTHOGONALIZATIONS:
        q = orthogonalize(matrices, method)
        assert q[0, :, 1].norm() == pytest.approx(1.0, abs=1e-3), method
        assert abs(float(q[0, :, 1] @ b)) == pytest.approx(1.0, abs=1e-2), method


@pytest.mark.parametrize(
    "spec", ["powersgd:rank=4@ring", "powersgd@alltoall", "acpsgd:rank=2@serial"]
)
def test_an_algorithm_after_an_at_sign_is_refused_as_such(spec):
    """A codec spec's ``@ALGORITHM`` (README: ``CODEC[:options][@ALGORITHM]``) on a low-rank
    spec was read into its last option or its name: "option rank='4@ring' ... must be an
    int", "unknown low-rank algorithm 'powersgd@alltoall'", saying nothing of the '@'."""
    with pytest.raises(ValueError, match=f"low-rank spec '{spec}' takes no '@ALGORITHM'"):
        get_algorithm(spec)


@pytest.mark.parametrize("spec", ["int8", "int4:block=128", "int8@alltoall", "none"])
def test_a_codec_spec_is_refused_with_the_hook_that_takes_it(spec):
    """``cp.lowrank.ddp_hook("int8")`` said "unknown low-rank algorithm 'int8'; known:
    ['acpsgd', 'powersgd']" (or, with '@', that a low-rank spec takes none): the README
    names the two DDP hooks side by side, and a newcomer mixes them up."""
    with pytest.raises(ValueError, match=rf"'{spec}' is a codec spec.*cp\.ddp\.hook"):
        get_algorithm(spec)
