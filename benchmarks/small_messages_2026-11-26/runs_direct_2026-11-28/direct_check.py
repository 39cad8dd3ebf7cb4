"""``direct`` against ``ring`` and ``backend`` on 3 local ranks (needs the patch of this
folder applied; run from the repository root with ``PYTHONPATH=src``). Per rank: for 1,
1000 and 65536 elements, whether int8 ``direct`` equals int8 ``ring`` and ``backend`` bit for
bit and ``none`` ``direct`` equals torch's all-gather; what a call raises where rank 1 runs
``ring`` and the others ``direct``; and the result of a call after it."""

from datetime import timedelta

import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed


def compare(rank, world_size):
    results = []
    for numel in (1, 1000, 1 << 16):
        inp = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        outs = {}
        for algorithm in ("ring", "direct", "backend"):
            outs[algorithm] = torch.empty(numel * world_size)
            cp.all_gather_into_tensor(outs[algorithm], inp, codec="int8", algorithm=algorithm)
        reference, plain = torch.empty(numel * world_size), torch.empty(numel * world_size)
        dist.all_gather_into_tensor(reference, inp)
        cp.all_gather_into_tensor(plain, inp, codec="none", algorithm="direct")
        results.append(
            (
                torch.equal(outs["ring"], outs["direct"]),
                torch.equal(outs["backend"], outs["direct"]),
                torch.equal(plain, reference),
            )
        )
    algorithm = "ring" if rank == 1 else "direct"
    try:
        out = torch.empty(4 * world_size)
        cp.all_gather_into_tensor(
            out, torch.ones(4), codec="int8", algorithm=algorithm, timeout=timedelta(seconds=20)
        )
        results.append("no error")
    except Exception as error:  # noqa: BLE001 - what each rank raised is the result
        results.append(type(error).__name__)
    out = torch.empty(4 * world_size)
    cp.all_gather_into_tensor(out, torch.ones(4) * rank, codec="none", algorithm="direct")
    results.append(out.tolist())
    return results


if __name__ == "__main__":
    for by_rank in run_distributed(compare, 3, timeout=120):
        print(by_rank)
