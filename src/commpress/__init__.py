"""commpress: cheaper communication for distributed PyTorch training.

The public names, and the subpackages (``cp.sim``, ``cp.collectives``...), are imported on
first use, so that ``import commpress`` (and the ``commpress cluster`` and ``commpress
launch`` commands, which need no torch) stay quick: ``cp.all_gather_into_tensor`` imports
torch and the collectives the first time it is read.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: public name -> (module, attribute in it; None for the module itself)
_PUBLIC = {
    "Codec": ("commpress.codecs", "Codec"),
    "get_codec": ("commpress.codecs", "get_codec"),
    "list_codecs": ("commpress.codecs", "list_codecs"),
    "all_gather_into_tensor": ("commpress.collectives", "all_gather_into_tensor"),
    "all_gather_single": ("commpress.collectives", "all_gather_single"),
    "all_reduce": ("commpress.collectives", "all_reduce"),
    "reduce_scatter_single": ("commpress.collectives", "reduce_scatter_single"),
    "reduce_scatter_tensor": ("commpress.collectives", "reduce_scatter_tensor"),
    "release_workspace": ("commpress.collectives", "release_workspace"),
    "ddp": ("commpress.integrations.ddp", None),
    "fsdp": ("commpress.integrations.fsdp", None),
    "lowrank": ("commpress.lowrank", None),
}

if TYPE_CHECKING:
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


def __getattr__(name: str):
    if name in _PUBLIC:
        module_name, attribute = _PUBLIC[name]
        module = importlib.import_module(module_name)
        value = module if attribute is None else getattr(module, attribute)
    elif name.isidentifier() and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")  # cp.sim, cp.collectives...
    else:
        raise AttributeError(f"module 'commpress' has no attribute {name!r}")
    globals()[name] = value  # later reads skip this function
    return value


#: what this file imports for itself, not for its users
_OWN_IMPORTS = {"TYPE_CHECKING", "annotations", "importlib"}


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC} - _OWN_IMPORTS)


__all__ = [  # the names of _PUBLIC, written out for the tools that read __all__ statically
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
