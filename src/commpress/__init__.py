"""commpress: cheaper communication for distributed PyTorch training."""

from commpress import lowrank
from commpress.codecs import Codec, get_codec, list_codecs
from commpress.collectives import (
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    reduce_scatter_single,
    reduce_scatter_tensor,
    release_workspace,
)
from commpress.integrations import ddp, fsdp

__version__ = "0.1.0"

__all__ = [
    "Codec",
    "__version__",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "ddp",
    "fsdp",
    "get_codec",
    "list_codecs",
    "lowrank",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "release_workspace",
]
