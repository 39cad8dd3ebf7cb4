"""Bus-bandwidth factors of nccl-tests: the one place for them.

busbw = algbw x factor makes a collective's bandwidth comparable with the link
bandwidth, whatever the number of ranks n.
"""

from __future__ import annotations


def busbw_factor(op: str, world_size: int) -> float:
    n = world_size
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "all_reduce":
        return 2 * (n - 1) / n
    raise ValueError(f"unknown op {op!r}; known: all_gather, reduce_scatter, all_reduce")
