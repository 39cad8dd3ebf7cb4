"""What every test shares: the fork server of ``run_distributed`` also imports what many
of the tests' ranks import (each rank unpickles a function of a test module, so it imports
that module and, with it, pytest; many shard models with FSDP2; several save checkpoints)."""

from commpress.cluster import local

local.preload("pytest", *local.FSDP_MODULES, "torch.distributed.checkpoint")
