"""Batched operators of low-rank compression: gradients as matrices, orthogonalization.

Every operator takes a batch of same-shape matrices ``(b, n, r)`` so that many
layers cost one kernel launch, and computes in fp32 whatever the input dtype.
"""

from __future__ import annotations

import torch

ORTHOGONALIZATIONS = ("gram-schmidt", "householder", "cholesky")
#: Cholesky-QR squares the condition number: a first screen, by the ratio of the
#: Cholesky factor's diagonal, which underestimates it.
CHOLESKY_MAX_CONDITION = 1e3
#: Then Cholesky-QR's columns are checked: off from orthonormal by more than this (or by
#: what computing the check costs in fp32 on very tall matrices), the matrix goes to
#: Householder.
CHOLESKY_MAX_ERROR = 1e-4
_TINY = 1e-30
_EPS = torch.finfo(torch.float32).eps
#: Gram-Schmidt zeroes a column left with less than this share of its norm once the
#: columns before it are projected out twice: the projections' own rounding (about half
#: an ulp of it for a column that is exactly a combination of the others), which no
#: further projection makes orthogonal. A larger remainder, rounding noise of the matrix
#: itself included, is kept as a direction of its own.
DEPENDENT = 8 * _EPS


def as_matrix(tensor: torch.Tensor) -> torch.Tensor | None:
    """A view of a gradient as a matrix: linear ``(out, in)``, conv ``(out, in*kh*kw)``;
    None for tensors with fewer than two dimensions (biases, norms) or no elements."""
    if tensor.dim() < 2 or tensor.numel() == 0:
        return None
    return tensor.reshape(tensor.shape[0], -1)


def orthogonalize(matrices: torch.Tensor, method: str = "gram-schmidt") -> torch.Tensor:
    """Orthonormal columns spanning each matrix's columns, ``(b, n, r)`` with ``r <= n``.

    Returns a new fp32 tensor. A zero column stays zero (it spans nothing); Gram-Schmidt
    also zeroes one whose norm is at most :data:`_TINY`, or that is a combination of the
    columns before it (to :data:`DEPENDENT`); ``cholesky`` falls back to
    Householder for matrices whose Gram matrix is too ill-conditioned, or whose columns
    come out further than :data:`CHOLESKY_MAX_ERROR` from orthonormal.
    """
    if method not in ORTHOGONALIZATIONS:
        raise ValueError(f"unknown orthogonalization {method!r}; known: {ORTHOGONALIZATIONS}")
    if matrices.dim() != 3:
        raise ValueError(f"matrices must be a batch (b, n, r), got shape {tuple(matrices.shape)}")
    if matrices.shape[2] > matrices.shape[1]:
        raise ValueError(
            f"cannot orthogonalize {matrices.shape[2]} columns in {matrices.shape[1]} dimensions"
        )
    matrices = matrices.float()
    if matrices.shape[2] == 0:
        return matrices.clone()
    if method == "gram-schmidt":
        return _gram_schmidt(matrices)
    if method == "householder":
        return _householder(matrices)
    return _cholesky_qr(matrices)


def _gram_schmidt(matrices: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt over columns, all matrices of the batch at once, each projection done
    twice: once leaves a nearly dependent column (a gradient of lower rank than the
    factor) far from orthogonal to the others."""
    result = matrices.clone()
    for column in range(result.shape[2]):
        current = result[:, :, column : column + 1]
        previous = result[:, :, :column]
        # in float64: the squares of fp32 values below about 1e-19 underflow in fp32
        before = current.double().norm(dim=1, keepdim=True)
        for _ in range(2 if column else 0):
            current -= previous @ (previous.transpose(1, 2) @ current)
        norm = current.double().norm(dim=1, keepdim=True)
        # a NaN norm spans: the NaN reaches the column
        spans = ~((norm <= _TINY) | (norm < DEPENDENT * before))
        current /= torch.where(spans, norm, torch.ones_like(norm)).float()
        current.masked_fill_(~spans, 0.0)
    return result


def unit_columns(matrices: torch.Tensor) -> torch.Tensor:
    """Each column of a batch ``(b, n, r)`` scaled to norm 1, in fp32 (a zero column stays
    zero, a NaN one NaN); norms in float64, whose squares do not underflow."""
    wide = matrices.double()
    norms = wide.norm(dim=1, keepdim=True)
    return (wide / torch.where(norms > 0, norms, torch.ones_like(norms))).float()


def _householder(matrices: torch.Tensor) -> torch.Tensor:
    q, r = torch.linalg.qr(matrices, mode="reduced")
    # Zero columns come back as arbitrary unit vectors from QR; keep them zero.
    signs = torch.sign(torch.diagonal(r, dim1=1, dim2=2))
    return q * torch.where(signs == 0, torch.zeros_like(signs), torch.ones_like(signs)).unsqueeze(1)


def _cholesky_qr(matrices: torch.Tensor) -> torch.Tensor:
    gram = matrices.transpose(1, 2) @ matrices
    lower, info = torch.linalg.cholesky_ex(gram)
    diagonal = torch.diagonal(lower, dim1=1, dim2=2)
    smallest, largest = diagonal.min(dim=1).values, diagonal.max(dim=1).values
    fine = (info == 0) & (smallest > 0) & (largest <= smallest * CHOLESKY_MAX_CONDITION)
    result = torch.empty_like(matrices)
    if fine.any():
        # Q = A L^-T, i.e. solve L Q^T = A^T
        solved = torch.linalg.solve_triangular(
            lower[fine], matrices[fine].transpose(1, 2), upper=False
        ).transpose(1, 2)
        result[fine] = solved
        tolerance = max(CHOLESKY_MAX_ERROR, 4 * matrices.shape[1] ** 0.5 * _EPS)
        fine[fine.clone()] = _orthonormal(solved, tolerance)
    if (~fine).any():
        result[~fine] = _householder(matrices[~fine])
    return result


def _orthonormal(matrices: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Whether each matrix's columns are orthonormal to ``tolerance`` (False for NaN)."""
    identity = torch.eye(matrices.shape[2], device=matrices.device)
    error = (matrices.transpose(1, 2) @ matrices - identity).abs().flatten(1).amax(dim=1)
    return error <= tolerance


def times(matrices: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``M @ F`` for a batch, ``(b, n, m) @ (b, m, r)``, computed as ``(F^T M^T)^T``: with
    ``r`` small, that order streams ``M`` row by row and is twice as fast on CPU."""
    return torch.bmm(factor.transpose(1, 2), matrices.transpose(1, 2)).transpose(1, 2)


def transposed_times(matrices: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``M^T @ F`` for a batch, ``(b, n, m)^T @ (b, n, r)``, as ``(F^T M)^T`` (5x faster
    on CPU than a transposed ``M`` on the left)."""
    return torch.bmm(factor.transpose(1, 2), matrices).transpose(1, 2)


def group_by_shape(matrices: list[torch.Tensor]) -> dict[tuple[int, ...], list[int]]:
    """Indices of same-shape matrices, so each group is one batched kernel."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, matrix in enumerate(matrices):
        groups.setdefault(tuple(matrix.shape), []).append(index)
    return groups
