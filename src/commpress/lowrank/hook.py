"""``ddp_hook(algorithm)``: low-rank compression as a DistributedDataParallel comm hook.

With the scheduler (default), each bucket's compression and all-reduces run on a
worker thread in bucket order while the training thread goes on with backward;
the hook returns a future at once and never blocks inside a callback (torch
2.13's ``powerSGD_hook`` chains collectives from callbacks, and on gloo it hung or
aborted with a collective mismatch in our runs). Without it, the
hook does everything before returning: the baseline that shows what overlap buys.
"""

# No ``from __future__ import annotations``: DDP checks the hook's return annotation object.
import concurrent.futures
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from commpress.lowrank.algorithm import LowRankAlgorithm
from commpress.lowrank.reducer import Reducer
from commpress.lowrank.registry import get_algorithm


@dataclass
class LowRankHookState:
    reducer: Reducer
    names: dict
    scheduler: bool
    worker: concurrent.futures.ThreadPoolExecutor | None = field(default=None, repr=False)

    def state_dict(self) -> dict:
        return self.reducer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.reducer.load_state_dict(state)


def ddp_hook(
    algorithm: LowRankAlgorithm | str,
    *,
    model: torch.nn.Module | None = None,
    group: dist.ProcessGroup | None = None,
    scheduler: bool = True,
):
    """``(state, hook)`` for ``DistributedDataParallel.register_comm_hook``.

    ``algorithm``: a :class:`LowRankAlgorithm` or a spec (``"powersgd:rank=4"``).
    ``model`` (the module DDP wraps) names the state of each parameter, which
    ``state.state_dict()`` needs. Call on every rank: without ``group`` it creates
    one for the hook's all-reduces.
    """
    if isinstance(algorithm, str):
        algorithm = get_algorithm(algorithm)
    if group is None:
        group = dist.new_group()
    names = {id(p): name for name, p in model.named_parameters()} if model is not None else {}
    worker = None
    if scheduler:
        worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="commpress-lowrank")
    return LowRankHookState(Reducer(algorithm, group), names, scheduler, worker), lowrank_hook


def lowrank_hook(state: LowRankHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    pairs = [
        (state.names.get(id(parameter), parameter), gradient)
        for parameter, gradient in zip(bucket.parameters(), bucket.gradients(), strict=True)
    ]
    buffer, last = bucket.buffer(), bucket.is_last()

    def reduce() -> torch.Tensor:
        state.reducer.reduce_part(pairs)
        if last:
            state.reducer.finish_step()
        return buffer

    future = torch.futures.Future()
    if state.worker is None:
        future.set_result(reduce())
        return future

    def complete(done: concurrent.futures.Future) -> None:
        error = done.exception()
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(done.result())

    state.worker.submit(reduce).add_done_callback(complete)
    return future
