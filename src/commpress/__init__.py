"""commpress: cheaper communication for distributed PyTorch training."""

import importlib

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
from commpress.integrations import ddp

__version__ = "0.1.0"


def __getattr__(name: str):
    # cp.fsdp imports torch's FSDP2 and DTensor (about 0.9 s): only for those who use it.
    if name == "fsdp":
        return importlib.import_module("commpress.integrations.fsdp")
    raise AttributeError(f"module 'commpress' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "fsdp"})


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
