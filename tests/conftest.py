"""What every test shares: the fork server of ``run_distributed`` also imports what many
of the tests' ranks import (each rank unpickles a function of a test module, so it imports
that module and, with it, pytest; several save and load checkpoints)."""

from commpress.cluster import local

local.PRELOADED_MODULES += ["pytest", "torch.distributed.checkpoint"]
