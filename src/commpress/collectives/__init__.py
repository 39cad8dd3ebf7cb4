"""Compressed collectives with torch.distributed's calling convention.

``all_gather_into_tensor``, ``reduce_scatter_tensor`` and ``all_reduce``, each with the
algorithms registered in :mod:`commpress.schedules` plus ``native`` (torch's own);
``async_op=True`` returns a handle with ``wait()`` and ``is_completed()``; ``timeout=``
bounds the wait for a dead or stalled peer. Every algorithm runs through one executor
(:mod:`commpress.collectives.executor`). Scratch buffers are kept between calls;
``release_workspace()`` frees them.
"""

from commpress.collectives.all_gather import ALL_GATHER_ALGORITHMS, all_gather_into_tensor
from commpress.collectives.all_reduce import ALL_REDUCE_ALGORITHMS, all_reduce
from commpress.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS, reduce_scatter_tensor
from commpress.collectives.work import release_workspace
from commpress.schedules import DEFAULT_CHUNK_BYTES

# torch 2.13 names these all_gather_single / reduce_scatter_single: offer both.
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor

__all__ = [
    "ALL_GATHER_ALGORITHMS",
    "ALL_REDUCE_ALGORITHMS",
    "DEFAULT_CHUNK_BYTES",
    "REDUCE_SCATTER_ALGORITHMS",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "reduce_scatter_single",
    "release_workspace",
    "reduce_scatter_tensor",
]
