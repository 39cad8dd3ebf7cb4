"""``cp.ddp.hook(codec)``: a ``DistributedDataParallel`` comm hook with compressed all-reduce.

The hook returns at once with a ``torch.futures.Future`` that the communication
thread completes; nothing ever blocks inside a future callback, and collectives are
issued in the same order on every rank.
"""

# No ``from __future__ import annotations``: DDP checks the hook's return annotation object.
import contextlib
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.codecs import Codec
from commpress.collectives import ALL_REDUCE_ALGORITHMS, all_reduce
from commpress.collectives.checks import check_group, check_reduction_dtype, check_timeout
from commpress.collectives.failures import named_failures
from commpress.collectives.inband import call_wire_bytes
from commpress.collectives.work import for_ddp, launch
from commpress.integrations.groups import own_groups, standing_in_for
from commpress.integrations.spec import CollectiveSpec
from commpress.integrations.stats import CommStats, Stopwatch
from commpress.schedules import wire_bytes
from commpress.transport import collective, owned_groups
from commpress.transport.p2p import wait as wait_work


@dataclass
class HookState:
    """The hook's configuration and counters; ``group`` carries only commpress's traffic."""

    spec: CollectiveSpec
    group: dist.ProcessGroup
    timeout: timedelta | None
    stats: CommStats = field(default_factory=CommStats)
    #: The caller's group, which may be the one DDP itself uses (see ``hook``).
    shared_group: bool = False


def hook(
    codec: str | Codec = "int8",
    *,
    group: dist.ProcessGroup | None = None,
    timeout: timedelta | None = None,
):
    """``(state, hook)`` for ``DistributedDataParallel.register_comm_hook(state, hook)``.

    ``codec``: ``"CODEC[:options][@ALGORITHM]"`` (``"int8"``, ``"int4@alltoall"``,
    ``"none@native"`` for torch's own all-reduce), or a codec object (over the ring).
    Gradients are averaged over the group. Call it on every rank: without ``group`` it
    makes one of the whole world (a
    collective call), this hook's alone, so that commpress's traffic never interleaves
    with DDP's own nor with another hook's; once ``state`` is garbage-collected, a later
    hook takes it over (:mod:`commpress.transport.owned_groups`). For a
    DDP on a subgroup (``process_group=pg``), pass a group of ``pg``'s ranks made for the
    hook, or ``pg`` itself: the hook cannot read DDP's group. A ``group`` given may be the
    one DDP runs its own collectives on (with ``find_unused_parameters=True``, one right
    after the last bucket's hook): with any ``group`` given, the hook waits for the last
    bucket's compressed all-reduce before it returns, so that every rank issues DDP's
    collective after it. ``timeout``: a peer that
    dies or stalls makes the step raise after at most this long (default: the group's; for the
    group the hook makes, the world's);
    torch's all-reduce (``@native``) takes the group's own, so there it needs the group
    the hook makes (no ``group``).
    """
    spec = CollectiveSpec.parse(codec, ALL_REDUCE_ALGORITHMS, "codec", gathers=True)
    check_timeout(timeout)
    if spec.algorithm == "native" and timeout is not None and group is not None:
        raise ValueError(
            f"codec={codec!r} runs torch's all-reduce, which waits as long as its group's "
            "timeout, not timeout=: pass no group (the hook makes one with timeout=), or a "
            "group made with new_group(timeout=...) and no timeout="
        )
    check_group(group, member=True)
    state = HookState(spec, group, timeout, shared_group=group is not None)
    if group is None:
        # torch's own all-reduce (@native) waits for this timeout too
        request = ("ddp hook", None, None, standing_in_for(None, timeout))
        (state.group,) = own_groups(state, [request], "ddp.hook")
    return state, compressed_allreduce_hook


def _wait_native(state: HookState, issued: float, work) -> None:
    """Wait for torch's all-reduce on gloo (``issued`` at that ``time.monotonic()``) from the
    communication thread, its failure named: a Python callback on gloo's future, still
    pending at interpreter exit (a later bucket's, after a peer stalled), aborted the
    process as gloo's thread completed it during finalization."""
    spec = state.spec
    with named_failures("all_reduce", spec.codec, "native", state.group, state.timeout, issued):
        wait_work(work, state.timeout)


def check_bucket(bucket, hook_name: str) -> None:
    """``bucket`` must be what DDP's C++ reducer hands a comm hook (a ``GradBucket``, or
    anything with its ``buffer()``). Under dynamo's ``optimize_ddp="python_reducer"`` DDP
    calls every comm hook once per parameter with ``(grad, param)`` and drops what it
    returns, which no bucket hook can serve."""
    if hasattr(bucket, "buffer"):
        return
    if isinstance(bucket, tuple):
        raise TypeError(
            f"{hook_name} was handed {type(bucket).__name__} of {len(bucket)} (a gradient "
            "and its parameter), not a DDP bucket: DDP does so under "
            'torch._dynamo.config.optimize_ddp = "python_reducer" (compiled autograd), '
            "which calls comm hooks per parameter and ignores the future they return; "
            "commpress's hooks need DDP's C++ reducer: set optimize_ddp to "
            '"ddp_optimizer" (the default) before building DistributedDataParallel'
        )
    raise TypeError(
        f"{hook_name} takes a DDP bucket (torch.distributed.GradBucket), got "
        f"{type(bucket).__name__}"
    )


def compressed_allreduce_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    check_bucket(bucket, "cp.ddp.hook")
    tensor = bucket.buffer()
    spec, world_size = state.spec, state.group.size()
    if tensor.layout != torch.strided and spec.algorithm != "native":
        raise TypeError(_not_dense(bucket, spec))
    if spec.algorithm != "native":
        check_reduction_dtype(tensor.dtype, "the bucket's dtype", "cp.ddp.hook('none@native')")
    numel, dtype = tensor.numel(), tensor.dtype
    raw = wire_bytes("all_reduce", "native", "none", numel, world_size, dtype)
    wire = call_wire_bytes("all_reduce", spec.algorithm, spec.codec, tensor, state.group)
    watch = Stopwatch(state.stats, wire, raw)
    # scaled by 1/n, then summed: what DDP does without a hook, so that `none` gives its
    # bits at any world size (a sum divided afterwards differs in the last bit from 3 on)
    tensor.mul_(1 / world_size)
    if spec.algorithm == "native":
        issued = time.monotonic()
        work = collective.all_reduce(tensor, dist.ReduceOp.SUM, state.group)
        if not tensor.is_cuda:
            waited = launch(lambda: _wait_native(state, issued, work), async_op=True)
            return for_ddp(waited.torch_future(tensor, before=watch.stop))

        def averaged(summed: torch.futures.Future) -> torch.Tensor:
            try:
                summed.value()  # re-raises the all-reduce's error
            except Exception:
                owned_groups.mark_failed(state.group)
                raise
            watch.stop()
            return tensor

        return work.get_future().then(averaged)
    work = all_reduce(
        tensor,
        dist.ReduceOp.SUM,
        state.group,
        codec=spec.codec,
        algorithm=spec.algorithm,
        async_op=True,
        timeout=state.timeout,
    )
    future = for_ddp(work.torch_future(tensor, before=watch.stop))
    if state.shared_group and bucket.is_last():
        _finished(work)
    return future


def _finished(work) -> None:
    """Until ``work`` has finished, its failure left to its future: DDP's own collective,
    which may follow the last bucket's hook on the group given (a ring or an all-to-all of
    commpress's ran on when DDP's all-reduce began, in another order on each rank: gloo
    hung), waits for it."""
    with contextlib.suppress(Exception):  # the future the hook returns fails with it
        work.wait()


def _not_dense(bucket, spec: CollectiveSpec) -> str:
    """DDP hands a sparse gradient (``nn.Embedding(sparse=True)``) in a bucket of its own."""
    shapes = ", ".join(str(tuple(parameter.shape)) for parameter in bucket.parameters())
    return (
        f"the gradient of the parameter of shape {shapes} is a {bucket.buffer().layout} "
        f"tensor (nn.Embedding(sparse=True) and the like): cp.ddp.hook({spec.text!r}) takes "
        "dense gradients only; use dense gradients, or cp.ddp.hook('none@native') (torch's "
        "own all-reduce, which takes sparse tensors on gloo)"
    )
