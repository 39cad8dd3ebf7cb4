"""One interface for low-rank gradient compression (PowerSGD and its family).

An algorithm works on a *batch* of same-shape matrices ``M`` (``b x n x m``: the
gradients plus their error feedback) and says, round by round, which factor to
all-reduce (low-rank factors add linearly, so a sum over ranks is the sum of the
compressed gradients), what to do with the sum, and how to reconstruct the
averaged gradient. Everything else (grouping by shape, fusing every batch's
factor and the uncompressed tensors into one all-reduce per round, error
feedback, warm-up, statistics, checkpoints) is :class:`commpress.lowrank.Reducer`'s.
A new algorithm is one file with the six abstract methods below; what a step starts from
(warm-started, or drawn afresh per matrix) is the reducer's too (:meth:`LowRankAlgorithm.start`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from commpress.collectives.checks import check_flag
from commpress.lowrank.operators import ORTHOGONALIZATIONS
from commpress.seeds import seed_of

#: A batch's algorithm state: named factor tensors, each ``(b, rows, rank)``.
Factors = dict[str, torch.Tensor]
#: How a matrix is known to its random draws: ``("name", its key)`` for a key that is a name,
#: else ``("unnamed", the order its key first came in)``; one per matrix of a batch.
Identity = tuple[str, object]
#: Seeds are at most this (``torch.Generator.manual_seed`` takes a signed 64-bit one).
SEEDS = 1 << 63


class LowRankAlgorithm(ABC):
    name: str = ""

    def __init__(
        self,
        rank: int = 4,
        *,
        start_iter: int = 10,
        min_compression_rate: float = 2.0,
        error_feedback: bool = True,
        warm_start: bool = True,
        orthogonalization: str = "gram-schmidt",
        seed: int = 0,
    ) -> None:
        """``rank``: columns of each factor. ``start_iter``: steps all-reduced uncompressed
        first. ``min_compression_rate``: a matrix is compressed only if its factors are more
        than this many times smaller, as torch's PowerSGD hook decides (else it joins the
        uncompressed tensors; so does any matrix whose smaller side is not above ``rank``).
        ``orthogonalization``: ``gram-schmidt``, ``householder`` or ``cholesky``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be an int of at least 1, got {rank!r}")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"start_iter must be a non-negative int, got {start_iter!r}")
        if isinstance(min_compression_rate, bool) or not isinstance(
            min_compression_rate, (int, float)
        ):
            raise TypeError(f"min_compression_rate must be a number, got {min_compression_rate!r}")
        if not min_compression_rate >= 1:
            raise ValueError(f"min_compression_rate must be at least 1, got {min_compression_rate}")
        check_flag(error_feedback, "error_feedback")
        check_flag(warm_start, "warm_start")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if not 0 <= seed < SEEDS:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        if orthogonalization not in ORTHOGONALIZATIONS:
            raise ValueError(
                f"unknown orthogonalization {orthogonalization!r}; known: {ORTHOGONALIZATIONS}"
            )
        self.rank, self.start_iter = rank, start_iter
        self.min_compression_rate = float(min_compression_rate)
        self.error_feedback, self.warm_start = error_feedback, warm_start
        self.orthogonalization, self.seed = orthogonalization, seed

    def draw(
        self,
        identities: Sequence[Identity],
        shape: tuple[int, ...],
        step: int,
        purpose: int = 0,
        device=None,
    ) -> torch.Tensor:
        """Gaussian fp32 numbers, ``(len(identities), *shape)``, for compressed step ``step``:
        each matrix's from a stream of its own, seeded by the algorithm's seed, the matrix's
        identity, ``step`` and ``purpose`` (which keeps two draws of one step apart). So
        they are the same on every rank whose ``device`` is of one kind, whatever matrices
        share the batch (DDP's first buckets and its rebuilt ones batch them otherwise);
        on the CPU unless ``device`` is a GPU."""
        on = torch.device("cpu") if device is None else torch.device(device)
        drawn = torch.empty((len(identities), *shape), dtype=torch.float32, device=on)
        for row, identity in zip(drawn, identities, strict=True):
            seed = seed_of("commpress-lowrank-draw", self.seed, *identity, step, purpose)
            torch.randn(shape, generator=torch.Generator(device=on).manual_seed(seed), out=row)
        return drawn

    def revived(
        self, factor: torch.Tensor, identities: Sequence[Identity], step: int
    ) -> torch.Tensor:
        """``factor`` (``(b, rows, rank)``, the same on every rank) with each all-zero
        column drawn afresh. A zero column of a warm-started factor stays zero for good
        (``M @ 0 = 0``): a step whose gradient is zero, or of lower rank, would otherwise
        switch the matrix off, or lower its rank, from then on."""
        dead = (factor == 0).all(dim=1, keepdim=True)
        # on CUDA no wait for the GPU to tell whether a column is dead: a draw there, taken
        # where one is; the same on every rank of one GPU model (torch's CUDA draws above
        # about 250K numbers depend on the device's number of multiprocessors)
        if not factor.is_cuda and not bool(dead.any()):
            return factor
        fresh = self.draw(identities, factor.shape[1:], step, purpose=1, device=factor.device)
        return torch.where(dead, fresh, factor.float())

    def start(
        self, factor: torch.Tensor, identities: Sequence[Identity], step: int
    ) -> torch.Tensor:
        """What this step's power iteration starts from, given the last step's ``factor``
        (the one :meth:`starting_factor` names): with warm start, ``factor`` revived
        (:meth:`revived`); without, one drawn afresh (on the CPU), the same on every rank."""
        if self.warm_start:
            return self.revived(factor, identities, step)
        return self.draw(identities, factor.shape[1:], step).to(factor.device)

    def compresses(self, n: int, m: int) -> bool:
        """Whether an ``n x m`` matrix is worth compressing at this rank: torch's
        ``_should_compress``, in its arithmetic (a matrix at the rate exactly stays whole)."""
        if min(n, m) <= self.rank:
            return False
        return (n + m) * self.rank * self.min_compression_rate < n * m

    @abstractmethod
    def initial_factors(self, n: int, m: int, generator: torch.Generator) -> Factors:
        """Factors of one ``n x m`` matrix before its first compressed step (identical on
        every rank: ``generator`` is seeded the same everywhere)."""

    @abstractmethod
    def starting_factor(self, step: int) -> str:
        """The factor this step's first round starts from: the reducer replaces it by
        :meth:`start`'s (warm-started or drawn afresh, each matrix by its own identity)
        before it calls :meth:`factor` for round 0."""

    @abstractmethod
    def rounds(self, step: int) -> int:
        """All-reduces this step (``step`` counts compressed steps from 0)."""

    @abstractmethod
    def factor(
        self, round_: int, step: int, matrices: torch.Tensor, factors: Factors
    ) -> torch.Tensor:
        """The ``(b, rows, rank)`` tensor to sum over ranks in this round."""

    @abstractmethod
    def absorb(
        self, round_: int, step: int, total: torch.Tensor, factors: Factors, world_size: int
    ):
        """Take the sum over ranks of this round's factor into ``factors``."""

    @abstractmethod
    def reconstruct(self, step: int, factors: Factors) -> tuple[torch.Tensor, torch.Tensor]:
        """``(left, right)``, ``(b, n, rank)`` and ``(b, m, rank)``: the averaged gradient
        approximation is ``left @ right^T`` (the reducer writes it into the gradients)."""

    def local_approximation(
        self, step: int, factors: Factors
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """What this rank's own matrices were compressed to, as ``(left, right)`` like
        :meth:`reconstruct`, for error feedback (``error = M - left @ right^T``); or None
        when that is the averaged reconstruction, as in PowerSGD, where orthogonalizing
        after the all-reduce leaves no local one. Factors named with a leading ``_`` are
        scratch for one step."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, start_iter={self.start_iter})"
