"""``ddp_hook(algorithm)``: low-rank compression as a DistributedDataParallel comm hook.

With the scheduler (default), a worker thread takes the buckets in order while
the training thread goes on with backward, and pipelines them: when bucket i
arrives, its first all-reduce is started (asynchronously), then every older
bucket advances one round (its pending all-reduce is waited for, absorbed, and
its next one started, or it is finished). So bucket i's P travels while bucket
i-1's Q is computed, and the sequence of all-reduces depends only on the bucket
order: the same on every rank. The hook returns a future at once and never
blocks inside a callback (torch 2.13's ``powerSGD_hook`` chains collectives from
callbacks, and on gloo it hung or aborted with a collective mismatch in our
runs). Without the scheduler the hook does everything before returning: the
baseline that shows what overlap buys. On CUDA the worker runs on its own stream,
ordered after backward's stream, and the futures carry that stream's events to
DDP (the hook and scheduler ran once on one GPU with a one-rank NCCL group, before the
hand-over became the event recorded here; that form has not run: README, "What has run
on a GPU").
"""

# No ``from __future__ import annotations``: DDP checks the hook's return annotation object.
import concurrent.futures
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.weak import WeakIdKeyDictionary

from commpress._torch_private import compiled_original
from commpress.collectives.checks import check_flag, check_group
from commpress.collectives.work import for_ddp
from commpress.integrations.ddp import check_bucket
from commpress.integrations.groups import own_groups, standing_in_for
from commpress.lowrank.algorithm import LowRankAlgorithm
from commpress.lowrank.reducer import (
    Part,
    Reducer,
    check_checkpoint,
    checkpoint_names,
    frameless,
    not_dense,
    not_real,
)
from commpress.transport import collective
from commpress.units import counted


class UnnamedParameter:
    """The key of a parameter's state where ``ddp_hook`` was given no model to name it
    (the parameter itself, as key, kept the model's parameters and gradients alive for as
    long as the hook's state, one kept for its stats after the model was dropped, say)."""

    __slots__ = ("shape",)

    def __init__(self, parameter: torch.nn.Parameter) -> None:
        self.shape = tuple(parameter.shape)

    def __repr__(self) -> str:
        return f"<parameter of shape {self.shape}>"


@dataclass
class LowRankHookState:
    reducer: Reducer
    names: dict
    worker: concurrent.futures.ThreadPoolExecutor | None = field(default=None, repr=False)
    pipeline: "Pipeline | None" = field(default=None, repr=False)
    #: The caller's group, which may be the one DDP itself uses (see ``ddp_hook``).
    shared_group: bool = False
    #: The key of each parameter ``names`` lacks, by the parameter, held weakly.
    unnamed: WeakIdKeyDictionary = field(default_factory=WeakIdKeyDictionary, repr=False)

    @property
    def scheduler(self) -> bool:
        return self.worker is not None

    def key(self, parameter: torch.nn.Parameter):
        """The key of ``parameter``'s state: its name, or an :class:`UnnamedParameter`."""
        name = self.names.get(id(parameter))
        if name is not None:
            return name
        key = self.unnamed.get(parameter)
        if key is None:
            key = self.unnamed[parameter] = UnnamedParameter(parameter)
        return key

    def state_dict(self) -> dict:
        unnamed = [key for key in self.reducer.states if not isinstance(key, str)]
        if unnamed:
            raise TypeError(self._unnamed(unnamed))
        return self.reducer.state_dict()

    def _unnamed(self, parameters: list) -> str:
        shapes = ", ".join(str(tuple(p.shape)) for p in parameters)
        which = f"{counted(len(parameters), 'parameter')} of shapes {shapes}"
        if not self.names:
            return (
                f"state_dict names each parameter's state, and ddp_hook(..., model=) was not "
                f"given: pass the module DDP wraps (state is held for {which})"
            )
        return (
            f"state_dict names each parameter's state by the model given to ddp_hook, which "
            f"lacks {which}: model= is not the module DDP wraps"
        )

    def load_state_dict(self, state: dict) -> None:
        """Refuses a checkpoint with state for parameters the model (given to ``ddp_hook``)
        does not have: one of another model, or any where no model was given."""
        check_checkpoint(state)
        unknown = sorted(checkpoint_names(state) - set(self.names.values()))
        if unknown:
            listed = f"{', '.join(map(repr, unknown[:5]))}{' ...' if len(unknown) > 5 else ''}"
            if not self.names:
                raise ValueError(
                    f"checkpoint has low-rank state for parameters by name ({listed}), and "
                    f"ddp_hook(..., model=) was not given: the hook would never use it; pass "
                    f"the module DDP wraps"
                )
            raise ValueError(
                f"checkpoint has low-rank state for parameters this model does not have: "
                f"{listed} (a checkpoint of another model?)"
            )
        self.reducer.load_state_dict(state)


def _wrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP and ``torch.compile`` wrappers, in any nesting: its
    parameters' names are the ones the docs ask for (a wrapper prefixes ``module.`` or
    ``_orig_mod.``, and the names seed the factors)."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif (original := compiled_original(model)) is not None:
            model = original
        else:
            return model


def ddp_hook(
    algorithm: LowRankAlgorithm | str,
    *,
    model: torch.nn.Module | None = None,
    group: dist.ProcessGroup | None = None,
    scheduler: bool = True,
    timeout: timedelta | None = None,
):
    """``(state, hook)`` for ``DistributedDataParallel.register_comm_hook``.

    ``algorithm``: a :class:`LowRankAlgorithm` or a spec (``"powersgd:rank=4"``).
    ``model`` (the module DDP wraps) names the state of each parameter, which
    ``state.state_dict()`` needs. Call on every rank: without ``group`` it creates
    one of the whole world for the hook's all-reduces (the hook cannot see DDP's group: for
    a DDP on a subgroup, pass ``group``), the hook's alone until its reducer is
    garbage-collected, then taken over by a later hook
    (:mod:`commpress.transport.owned_groups`). A ``group`` given may be the one DDP runs
    its own collectives on (with ``find_unused_parameters=True``, one right after the last
    bucket's hook): with any ``group`` given, the scheduler finishes each step's last
    bucket before the hook returns, so that every rank issues DDP's collective after the
    hook's (the default, a group of the hook's own, keeps that bucket's work overlapped
    with the rest of backward). ``timeout``: a peer that dies or stalls makes the step raise
    on every other rank after at most this long (default: the group's; for the group the hook
    makes, the world's).
    """
    check_group(group, member=True)
    check_flag(scheduler, "scheduler")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be the torch.nn.Module DDP wraps, got {type(model).__name__}")
    if model is not None:
        model = _wrapped(model)
    reducer = Reducer(algorithm, group, timeout)  # checks its arguments before new_group
    if group is None:
        request = ("low-rank hook", None, None, standing_in_for(None, timeout))
        (reducer.group,) = own_groups(reducer, [request], "lowrank.ddp_hook")
    names = {id(p): name for name, p in model.named_parameters()} if model is not None else {}
    state = LowRankHookState(reducer, names, shared_group=group is not None)
    if scheduler:
        state.worker = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="commpress-lowrank"
        )
        state.pipeline = Pipeline(reducer)
    return state, lowrank_hook


def lowrank_hook(state: LowRankHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    check_bucket(bucket, "cp.lowrank.ddp_hook")
    if bucket.buffer().layout != torch.strided:  # DDP gives a sparse bucket no gradients()
        (parameter,) = bucket.parameters()
        key = state.names.get(id(parameter), f"of shape {tuple(parameter.shape)}")
        raise TypeError(not_dense(key, bucket.buffer().layout))
    for parameter in bucket.parameters():
        if parameter.is_complex():
            key = state.names.get(id(parameter), f"of shape {tuple(parameter.shape)}")
            raise TypeError(not_real(key, parameter.dtype))
    pairs = [
        (state.key(parameter), gradient)
        for parameter, gradient in zip(bucket.parameters(), laid_out(bucket), strict=True)
    ]
    buffer, last = bucket.buffer(), bucket.is_last()

    handed = time.perf_counter()
    cuda = buffer.device if buffer.is_cuda else None
    # On CUDA the future records the stream it is completed on, and DDP's stream waits for it
    future = torch.futures.Future(devices=[cuda]) if cuda else torch.futures.Future()
    if state.worker is None:
        state.reducer.reduce_part(pairs)
        if last:
            state.reducer.finish_step()
        state.reducer.stats.exposed_seconds += time.perf_counter() - handed
        future.set_result(buffer)
        return for_ddp(future)

    # Backward's stream has written the bucket by now; what it queues later is not waited for
    written = torch.cuda.current_stream(cuda).record_event() if cuda else None

    pipeline = state.pipeline  # not the state: the worker may outlive the training thread's wait

    def submit() -> None:
        with pipeline.side_stream(written):
            pipeline.submit(pairs, future, buffer, last, handed)

    handing_over = state.worker.submit(submit)
    if last and state.shared_group:
        handing_over.result()
    return for_ddp(future)


def laid_out(bucket) -> list[torch.Tensor]:
    """Each parameter's gradient in ``bucket``, with the parameter's strides: DDP lays a dense
    parameter's gradient out in the bucket as the parameter is (channels_last, a transposed
    weight), and ``bucket.gradients()`` views every one as contiguous, which makes of such a
    gradient another matrix (its columns permuted, or the transposed memory read by rows)."""
    buffer = bucket.buffer()
    return [
        buffer.as_strided(parameter.shape, parameter.stride(), gradient.storage_offset())
        if _dense_but_not_contiguous(parameter)
        else gradient
        for parameter, gradient in zip(bucket.parameters(), bucket.gradients(), strict=True)
    ]


def _dense_but_not_contiguous(parameter: torch.Tensor) -> bool:
    """What DDP's ``is_non_overlapping_and_dense`` tells, for a non-contiguous parameter:
    ``empty_like`` keeps the strides of exactly those."""
    if parameter.is_contiguous():
        return False
    return torch.empty_like(parameter, device="meta").stride() == parameter.stride()


@dataclass
class _InFlight:
    part: Part
    future: torch.futures.Future
    buffer: torch.Tensor
    round_: int = 0
    payload: torch.Tensor | None = None
    work: object = None
    started: float = 0.0


class Pipeline:
    """The scheduler's state, used only by its worker thread."""

    def __init__(self, reducer: Reducer) -> None:
        self.reducer = reducer
        self.in_flight: deque[_InFlight] = deque()
        self.finished: list[_InFlight] = []
        self.sequence = 0
        self.stream = None  # CUDA only: compression and all-reduces leave backward's stream

    @contextlib.contextmanager
    def side_stream(self, written):
        """On CUDA, run on the scheduler's own stream, after the event ``written`` (recorded
        on backward's stream when it handed the bucket over); on CPU (None), nothing."""
        if written is None:
            yield
            return
        if self.stream is None:
            self.stream = torch.cuda.Stream(written.device)
        self.stream.wait_event(written)
        with torch.cuda.stream(self.stream):
            yield

    def submit(self, pairs, future, buffer, last: bool, handed: float) -> None:
        """Take the bucket handed over at ``handed`` (a ``perf_counter`` time). An error
        fails every bucket in flight and breaks the reducer for good (a dead or stalled
        peer, say: the ranks' collectives are no longer in step), so that every later
        bucket fails at once, saying so (:meth:`Reducer.failing_for_good`)."""
        try:
            with self.reducer.failing_for_good():
                self._take(pairs, future, buffer, last, handed)
                return
        except BaseException as error:  # never leave DDP waiting on a future
            told = frameless(error)
        # out of the except clause: a callback that runs at set_exception (DDP's) and
        # raises would get ``error`` as its context, held by torch's C++ again
        self.in_flight.extend(self.finished)
        self.finished.clear()
        for waiting in self.in_flight:
            if not waiting.future.done():
                waiting.future.set_exception(told)
        if not future.done():
            future.set_exception(told)
        self.in_flight.clear()

    def _take(self, pairs, future, buffer, last: bool, handed: float) -> None:
        slot = self.sequence % (self.reducer.algorithm.rounds(0) + 2)  # parts alive at once
        self.sequence += 1
        entry = _InFlight(self.reducer.plan(pairs, slot), future, buffer)
        older = list(self.in_flight)
        self.in_flight.append(entry)
        self._start(entry)
        for waiting in older:
            self._advance(waiting)
        if last:
            while self.in_flight:
                self._advance(self.in_flight[0])
            self.reducer.finish_step()
            self.sequence = 0  # bucket j keeps slot j: its buffers are reused every step
            # backward had finished at the hand-over: since then the training thread waited
            self.reducer.stats.exposed_seconds += time.perf_counter() - handed
        # Completed only now: once the last future is done, DDP may read the step's state.
        for done in self.finished:
            done.future.set_result(done.buffer)
        self.finished.clear()

    def _start(self, entry: _InFlight) -> None:
        """Start the entry's current round, skipping rounds with nothing to send."""
        while entry.round_ < entry.part.rounds:
            entry.payload = entry.part.payload(entry.round_)
            if entry.payload is not None:
                entry.started = time.perf_counter()
                group = self.reducer.group
                entry.work = collective.all_reduce(entry.payload, dist.ReduceOp.SUM, group)
                return
            entry.round_ += 1
        self._finish(entry)

    def _advance(self, entry: _InFlight) -> None:
        if entry not in self.in_flight:
            return
        self.reducer.wait(entry.work)
        self.reducer.stats.seconds["communicate"] += time.perf_counter() - entry.started
        entry.part.take(entry.round_, entry.payload)
        entry.round_ += 1
        self._start(entry)

    def _finish(self, entry: _InFlight) -> None:
        entry.part.finish()
        self.in_flight.remove(entry)
        self.finished.append(entry)
