"""Schedules as data: what every algorithm does, step by step, for one rank.

Pure functions of (rank, world size, sizes, codec); nothing here touches
torch.distributed or a tensor. The executor (:mod:`commpress.collectives.executor`) runs
them; the byte counts (:mod:`commpress.schedules.wire`) and the cost model (:mod:`commpress.sim`)
read them.
"""

from commpress.schedules.payloads import (
    DEFAULT_CHUNK_BYTES,
    REDUCTION_DTYPES,
    partial_sum_dtype,
)
from commpress.schedules.registry import (
    NATIVE,
    OPS,
    PIPELINED_REDUCTIONS,
    Algorithm,
    algorithms,
    get_algorithm,
    plan,
    register,
)
from commpress.schedules.steps import Prepare, Receive, Schedule, Send, Step, Then, Transport
from commpress.schedules.wire import (
    busbw_factor,
    busiest_link_bytes,
    input_numel,
    moved_bytes,
    wire_bytes,
)

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "NATIVE",
    "OPS",
    "PIPELINED_REDUCTIONS",
    "Algorithm",
    "Prepare",
    "Receive",
    "Schedule",
    "Send",
    "Step",
    "Then",
    "Transport",
    "algorithms",
    "busbw_factor",
    "busiest_link_bytes",
    "get_algorithm",
    "input_numel",
    "moved_bytes",
    "partial_sum_dtype",
    "REDUCTION_DTYPES",
    "plan",
    "register",
    "wire_bytes",
]
