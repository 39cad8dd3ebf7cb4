"""The reduce-scatter's relative error on Gaussian contributions (independent seeds per
rank, three seeds) over the error the tuner expects (one encode's, grown along the
schedule), on local processes over gloo.

    python benchmarks/tuner_2026-11-26/error_probe.py 4   # and 6

Prints: ranks, codec, algorithm, [measured / expected for each seed], expected.
"""

import sys

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.sim import tuner


def fn(rank, world):
    out = {}
    m = 1 << 15
    for codec in ("int8", "int4"):
        for algo in ("ring", "ring-hop", "alltoall"):
            errs = []
            for seed in range(3):
                g = torch.Generator().manual_seed(1000 * seed + rank)
                whole = torch.randn(m * world, generator=g)
                got = torch.empty(m)
                cp.reduce_scatter_tensor(got, whole, codec=codec, algorithm=algo)
                exact = whole.double().clone()
                dist.all_reduce(exact)
                exact = exact.view(world, m)[rank]
                e2 = torch.tensor(
                    [(got.double() - exact).norm() ** 2, exact.norm() ** 2], dtype=torch.float64
                )
                dist.all_reduce(e2)
                errs.append((e2[0] / e2[1]).sqrt().item())
            out[codec, algo] = errs
    return out


if __name__ == "__main__":
    n = int(sys.argv[1])
    res = run_distributed(fn, n, timeout=300)[0]
    for (codec, algo), errs in res.items():
        pred = tuner.expected_rel_err(codec, "reduce_scatter", algo, n)
        print(n, codec, algo, [round(e / pred, 4) for e in errs], round(pred, 5))
