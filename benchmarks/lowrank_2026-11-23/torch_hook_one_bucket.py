"""Experiment: torch's ``powerSGD_hook`` with a single DDP bucket.

On gloo, torch's hook starts its next all-reduce inside a future's callback; with
several buckets those callbacks can run in a different order on different ranks. This
runs ``commpress`` with the given arguments, giving every ``torch-powersgd`` run one
bucket (``bucket_cap_mb=100000``) to see whether that alone makes it run, e.g.
``python torch_hook_one_bucket.py train --strategy ddp --hosts 4 --link 1gbit --steps 30
--dim 768 --layers 4 --context 8 --batch 1 --compare plain torch-powersgd:rank=4,start_iter=2``.
Worker processes re-import this file, so the change applies there too.
"""

import sys

from torch.nn.parallel import DistributedDataParallel

import commpress.train.loop as loop
from commpress.cli import main

_wrap_with_default_buckets = loop._wrap


def _wrap(model, config, run):
    if run.lowrank is not None and run.lowrank.startswith(loop.TORCH_POWERSGD):
        ddp = DistributedDataParallel(model, bucket_cap_mb=100_000)
        return ddp, loop._torch_powersgd(ddp, run.lowrank)
    return _wrap_with_default_buckets(model, config, run)


loop._wrap = _wrap

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
