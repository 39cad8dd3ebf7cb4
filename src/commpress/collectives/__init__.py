"""Compressed collectives with torch.distributed's calling convention (work in progress).

Done: ``all_gather_into_tensor`` (alias ``all_gather_single``) with algorithms
``native``, ``ring`` and ``ring-hop``, synchronous. Not yet: reduce-scatter,
all-reduce, ``async_op=True``, peer-failure timeouts (issue 3).
"""

from commpress.collectives.all_gather import ALL_GATHER_ALGORITHMS, all_gather_into_tensor

all_gather_single = all_gather_into_tensor

__all__ = ["ALL_GATHER_ALGORITHMS", "all_gather_into_tensor", "all_gather_single"]
