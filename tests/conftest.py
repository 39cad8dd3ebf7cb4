"""What every test shares: the fork server of ``run_distributed`` also imports what many
of the tests' ranks import (each rank unpickles a function of a test module, so it imports
that module and, with it, pytest; many shard models with FSDP2; several save checkpoints).

Where CUDA is available the server imports what it did on the GPU machines the tests last
ran on (2026-11-27): whether importing ``torch._dynamo`` (and inductor, triton) before the
fork leaves the forked ranks their CUDA has not been run."""

import torch

from commpress.cluster import local

PRELOADED_FOR_THE_TESTS = ["pytest"]
if not torch.cuda.is_available():
    PRELOADED_FOR_THE_TESTS += [*local.FSDP_MODULES, "torch.distributed.checkpoint"]
local.preload(*PRELOADED_FOR_THE_TESTS)
