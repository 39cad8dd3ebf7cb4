"""ACP-SGD (Zhang et al., 2023): alternate which factor is computed and communicated.

Even steps keep ``Q`` from the last odd step, orthogonalize it locally (it is
identical on every rank) and all-reduce ``P = M Q``; odd steps do the same with
the roles swapped. One all-reduce per step, half of PowerSGD's, and each step
warm-starts from the other factor. The kept factor is the same on every rank, so
each rank's compression is a local projection and error feedback uses it. Without warm
start, the kept factor is drawn afresh each step (the same on every rank): a random
projection.
"""

from __future__ import annotations

import torch

from commpress.lowrank.algorithm import Factors, LowRankAlgorithm
from commpress.lowrank.operators import orthogonalize, times, transposed_times


class ACPSGD(LowRankAlgorithm):
    name = "acpsgd"

    def initial_factors(self, n, m, generator) -> Factors:
        return {
            "p": torch.randn(n, self.rank, generator=generator, dtype=torch.float32),
            "q": torch.randn(m, self.rank, generator=generator, dtype=torch.float32),
        }

    def starting_factor(self, step: int) -> str:
        return "q" if step % 2 == 0 else "p"  # the kept one

    def rounds(self, step: int) -> int:
        return 1

    def factor(self, round_, step, matrices, factors) -> torch.Tensor:
        kept = self.starting_factor(step)
        factors[kept] = orthogonalize(factors[kept], self.orthogonalization)
        multiply = times if kept == "q" else transposed_times
        factors["_local"] = multiply(matrices, factors[kept])
        return factors["_local"]

    def absorb(self, round_, step, total, factors, world_size) -> None:
        factors["p" if step % 2 == 0 else "q"] = total / world_size

    def reconstruct(self, step, factors):
        return factors["p"], factors["q"]

    def local_approximation(self, step, factors):
        if step % 2 == 0:
            return factors["_local"], factors["q"]
        return factors["p"], factors["_local"]
