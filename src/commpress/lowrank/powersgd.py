"""PowerSGD (Vogels et al., 2019): one power iteration per step, warm-started.

``P = M Q``, all-reduce P, orthogonalize; ``Q = M^T P``, all-reduce Q, average;
the gradient is ``P Q^T``. Two all-reduces per step. The warm-started ``Q`` is of the
gradient's magnitude, so ``M Q`` would be of its square (below Gram-Schmidt's smallest
norm, or fp32's range, for gradients of 1e-16): each column of ``Q`` is scaled to norm 1
first, which leaves the span of ``P``, and so the result, as it was.
"""

from __future__ import annotations

import torch

from commpress.lowrank.algorithm import Factors, LowRankAlgorithm
from commpress.lowrank.operators import orthogonalize, times, transposed_times, unit_columns


class PowerSGD(LowRankAlgorithm):
    name = "powersgd"

    def initial_factors(self, n, m, generator) -> Factors:
        return {"q": torch.randn(m, self.rank, generator=generator, dtype=torch.float32)}

    def starting_factor(self, step: int) -> str:
        return "q"

    def rounds(self, step: int) -> int:
        return 2

    def factor(self, round_, step, matrices, factors) -> torch.Tensor:
        if round_ == 0:
            return times(matrices, unit_columns(factors["q"]))
        return transposed_times(matrices, factors["p"])

    def absorb(self, round_, step, total, factors, world_size) -> None:
        if round_ == 0:
            factors["p"] = orthogonalize(total, self.orthogonalization)
        else:
            factors["q"] = total / world_size

    def reconstruct(self, step, factors):
        return factors["p"], factors["q"]
