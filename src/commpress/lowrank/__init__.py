"""Low-rank gradient compression: PowerSGD and ACP-SGD behind one interface.

algorithm = cp.lowrank.PowerSGD(rank=4, start_iter=10)   # or ACPSGD(rank=4)
state, hook = cp.lowrank.ddp_hook(algorithm, model=model)
ddp.register_comm_hook(state, hook)
# or, in a custom loop: reducer = cp.lowrank.Reducer(algorithm); reducer.reduce(named_grads)
"""

from commpress.lowrank.acpsgd import ACPSGD
from commpress.lowrank.algorithm import LowRankAlgorithm
from commpress.lowrank.hook import LowRankHookState, ddp_hook
from commpress.lowrank.operators import as_matrix, orthogonalize
from commpress.lowrank.powersgd import PowerSGD
from commpress.lowrank.reducer import LowRankStats, Reducer
from commpress.lowrank.registry import get_algorithm

__all__ = [
    "ACPSGD",
    "LowRankAlgorithm",
    "LowRankHookState",
    "LowRankStats",
    "PowerSGD",
    "Reducer",
    "as_matrix",
    "ddp_hook",
    "get_algorithm",
    "orthogonalize",
]
