"""``Reducer``: averages gradients over a process group with a low-rank algorithm.

Per step: matrices worth compressing are grouped by shape (one batched kernel per
group) with their error feedback added; each round's factors of every group, and
in the first round every uncompressed tensor too, travel in *one* fused
all-reduce; the reconstruction is written back into the gradients. State
(factors, error) is keyed by the caller's key for each gradient (a parameter
name), so it survives a change of bucketing, and checkpoints with
``state_dict``/``load_state_dict`` without the process group.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.collectives.checks import check_group, check_timeout
from commpress.collectives.failures import add_note
from commpress.collectives.fingerprint import digest_pair, fingerprint_device, pair_agrees
from commpress.lowrank.algorithm import Identity, LowRankAlgorithm
from commpress.lowrank.operators import as_matrix, group_by_shape
from commpress.lowrank.registry import get_algorithm
from commpress.ranks import name_ranks, this_rank
from commpress.schedules import wire_bytes
from commpress.seeds import digest, seed_of
from commpress.transport import collective, owned_groups, p2p
from commpress.transport.objects import all_gather_objects
from commpress.units import counted

STAGES = ("compress", "communicate", "reconstruct")
FP32 = torch.float32
#: Lists of keys and shapes every rank was found to give alike, remembered (the latest).
#: DDP visits its buckets in a cycle, so a model of more buckets than this (at DDP's
#: default 25 MB a bucket, some 100 GB of fp32 gradients) pays the check every step.
AGREED_KEY_LISTS = 4096


@dataclass
class LowRankStats:
    steps: int = 0
    compressed_steps: int = 0
    sent_bytes: int = 0
    raw_bytes: int = 0
    nonfinite_matrices: int = 0
    seconds: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    #: What each rank puts on the wire for the all-reduces, sent and without compression
    #: (the all-reduce schedule's bytes: 2(n-1) chunks of a ring).
    wire_bytes: int = 0
    raw_wire_bytes: int = 0
    #: Time the training thread waited for the hook's work (all of it without the
    #: scheduler; with it, from the last bucket's hand-over to the last bucket's result).
    exposed_seconds: float = 0.0

    @property
    def compression_ratio(self) -> float:
        return self.raw_bytes / self.sent_bytes if self.sent_bytes else 1.0

    def count_sent(self, numel: int, world_size: int) -> None:
        """One fp32 all-reduce of ``numel`` elements."""
        self.sent_bytes += numel * 4
        self.wire_bytes += wire_bytes("all_reduce", "native", "none", numel, world_size, FP32)

    def count_raw(self, gradients: list[torch.Tensor], world_size: int) -> None:
        """What ``gradients`` would cost uncompressed: one all-reduce per dtype, each in its
        own dtype (as DDP's buckets go), not in the fp32 this reducer sums in."""
        numels: dict[torch.dtype, int] = {}
        for gradient in gradients:
            numels[gradient.dtype] = numels.get(gradient.dtype, 0) + gradient.numel()
        for dtype, numel in numels.items():
            self.raw_bytes += numel * dtype.itemsize
            self.raw_wire_bytes += wire_bytes(
                "all_reduce", "native", "none", numel, world_size, dtype
            )

    def snapshot(self) -> dict:
        """The counters ``commpress train`` reads from every integration (bytes each rank
        sends on the wire with a ring all-reduce, compressed and not)."""
        return {
            "calls": self.steps,
            "wire_bytes": self.wire_bytes,
            "raw_bytes": self.raw_wire_bytes,
            "seconds": self.seconds["communicate"],
            "exposed_seconds": self.exposed_seconds,
        }


class Reducer:
    def __init__(
        self,
        algorithm: LowRankAlgorithm | str,
        group: dist.ProcessGroup | None = None,
        timeout: timedelta | None = None,
    ):
        """``algorithm``: a :class:`LowRankAlgorithm` or a spec (``"powersgd:rank=4"``), as
        ``ddp_hook`` takes. ``timeout``: how long an all-reduce may wait for a dead or stalled
        peer before it raises (default: the process group's)."""
        if isinstance(algorithm, str):
            algorithm = get_algorithm(algorithm)
        if not isinstance(algorithm, LowRankAlgorithm):
            raise TypeError(
                "algorithm must be a LowRankAlgorithm or a spec such as 'powersgd:rank=4', "
                f"got {type(algorithm).__name__}"
            )
        check_group(group, member=True)
        check_timeout(timeout)
        self.algorithm, self.group, self.timeout = algorithm, group, timeout
        self.step = 0
        self.states: dict[Hashable, dict[str, torch.Tensor]] = {}
        self._unnamed: dict[Hashable, int] = {}  # keys that are no names, in the order first seen
        self.stats = LowRankStats()
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._error_stacks: dict[tuple, torch.Tensor] = {}
        self._keys_this_step: set = set()
        self._agreed: dict[int, None] = {}  # digests of key lists every rank gives, oldest first
        #: The step a planned part failed in, and why (:meth:`failing_for_good`).
        self._failure: tuple[int, BaseException] | None = None
        self._loaded = False  # states cloned by load_state_dict, not yet used (_adopt_loaded)

    # -- the public step ------------------------------------------------------------------

    def reduce(self, gradients: Sequence[tuple[Hashable, torch.Tensor]]) -> None:
        """Average ``(key, gradient)`` pairs over the group, in place; one training step."""
        self.reduce_part(gradients)
        self.finish_step()

    def reduce_part(self, gradients: Sequence[tuple[Hashable, torch.Tensor]]) -> None:
        """Average some of this step's gradients (a DDP bucket); call ``finish_step`` after
        the last part."""
        part = self.plan(gradients)
        with self.failing_for_good():
            for round_ in range(part.rounds):
                payload = part.payload(round_)
                if payload is not None:
                    start = time.perf_counter()
                    self.wait(collective.all_reduce(payload, dist.ReduceOp.SUM, self.group))
                    self.stats.seconds["communicate"] += time.perf_counter() - start
                    part.take(round_, payload)
            part.finish()

    @contextlib.contextmanager
    def failing_for_good(self) -> Iterator[None]:
        """An error of the body (the work of a part once planned) leaves the step half
        done: error buffers added to, some gradients written, an all-reduce perhaps issued
        on some ranks and not on others. Every later :meth:`plan` refuses, saying so."""
        try:
            yield
        except BaseException as error:
            if self._failure is None:
                self._failure = (self.step, frameless(error))
                owned_groups.mark_failed(self.group)
            raise

    def _check_not_failed(self) -> None:
        if self._failure is None:
            return
        step, error = self._failure
        raise RuntimeError(
            f"low-rank step {step} failed part-way ({type(error).__name__}: {error}): this "
            "reducer's state (error feedback, factors) is half updated and its group's "
            "all-reduces may be out of step between ranks, so it cannot go on; make a new "
            "one (on a new group), from a checkpoint saved before the failure"
        ) from error

    def plan(self, gradients: Sequence[tuple[Hashable, torch.Tensor]], slot: int = 0) -> Part:
        """The work of averaging ``gradients``, round by round, for a caller that runs the
        all-reduces itself (the scheduler overlaps several parts; each alive part needs
        its own ``slot`` of scratch buffers)."""
        self._check_not_failed()
        gradients = _pairs(gradients)
        for key, gradient in gradients:
            if gradient is None:
                raise TypeError(
                    f"gradient {key!r} is None (a parameter that got no gradient this step): "
                    f"give zeros in its place, so that every rank gives the same keys"
                )
            if not isinstance(gradient, torch.Tensor) or not gradient.is_floating_point():
                raise TypeError(f"gradient {key!r} must be a floating-point tensor")
            if gradient.layout != torch.strided:
                raise TypeError(not_dense(key, gradient.layout))
            if gradient.is_meta:
                raise TypeError(
                    f"gradient {key!r} is on the meta device: it holds no values to average "
                    f"(materialize the model, with to_empty() and its initialization, first)"
                )
            if _shares_elements(gradient):
                raise ValueError(
                    f"gradient {key!r} has stride 0 (strides {gradient.stride()}, shape "
                    f"{tuple(gradient.shape)}: an expanded tensor), so its elements share "
                    f"memory and cannot hold the average, which is written into it in place; "
                    f"give a gradient of its own (.contiguous())"
                )
            if gradient.requires_grad:
                raise TypeError(
                    f"gradient {key!r} requires grad: the average is written into it in "
                    f"place; give the parameter's .grad, not the parameter"
                )
        keys = [key for key, _ in gradients]
        if len(set(keys)) != len(keys):
            repeated = sorted({repr(key) for key in keys if keys.count(key) > 1})
            raise ValueError(f"gradients: keys {', '.join(repeated)} given twice (one state each)")
        self._check_keys_are_new(keys)
        self._check_ranks_give_the_same_keys(gradients)
        self._adopt_loaded()
        world_size = dist.get_world_size(self.group)
        if self.step < self.algorithm.start_iter:
            part = UncompressedPart(self, [g for _, g in gradients], world_size)
        else:
            compressed, plain = [], []
            for key, gradient in gradients:
                matrix = as_matrix(gradient)
                worth = matrix is not None and self.algorithm.compresses(*matrix.shape)
                (compressed if worth else plain).append((key, gradient))
            part = CompressedPart(self, compressed, [g for _, g in plain], world_size, slot)
        self._keys_this_step.update(keys)  # only once planned: a refused part takes none
        return part

    def wait(self, work) -> None:
        """Wait for one of this reducer's all-reduces; a peer that died, or stalled past
        the timeout, raises a RuntimeError saying so."""
        try:
            p2p.wait(work, self.timeout)
        except RuntimeError as error:
            raise RuntimeError(
                f"commpress low-rank all-reduce failed (a peer died or stalled; timeout "
                f"{self.timeout or 'of the process group'}): {error}"
            ) from error

    def finish_step(self) -> None:
        self.stats.compressed_steps += self.step >= self.algorithm.start_iter
        self.step += 1
        self.stats.steps += 1
        self._keys_this_step.clear()

    def _check_keys_are_new(self, keys: list) -> None:
        """A key in two parts of one step had its state updated twice; a caller that never
        calls ``finish_step`` stayed in warm-up (ACP-SGD: on one factor) for good."""
        again = self._keys_this_step.intersection(keys)
        if again:
            raise ValueError(
                f"gradients: keys {', '.join(sorted(map(repr, again)))} were already reduced "
                f"this step (call finish_step after a step's last part)"
            )

    def _check_ranks_give_the_same_keys(self, gradients: list) -> None:
        """Ranks that gave keys in other orders summed one key's gradient with another's,
        silently; a key missing on one rank left the all-reduces of different sizes. The
        first time this reducer plans a list of keys and shapes, the ranks compare digests
        of it (one all-reduce, as the collectives' argument check does), and on a mismatch
        exchange the lists, so that every rank raises naming the keys that differ; a list
        agreed before costs no collective. A rank that changes its list after it was agreed
        while the others keep theirs is not caught."""
        listed = tuple((_label(key), tuple(gradient.shape)) for key, gradient in gradients)
        seen = digest(repr(listed).encode())
        if seen in self._agreed:
            self._agreed[seen] = self._agreed.pop(seen)
            return
        if dist.get_world_size(self.group) > 1:
            device = gradients[0][1].device if gradients else torch.device("cpu")
            pair = digest_pair(seen, fingerprint_device(self.group, device))
            self.wait(collective.all_reduce(pair, dist.ReduceOp.MAX, self.group))
            if not pair_agrees(pair):
                every = all_gather_objects(listed, self.group, self.timeout)
                raise ValueError(self._keys_differ(every))
        self._agreed[seen] = None
        if len(self._agreed) > AGREED_KEY_LISTS:
            del self._agreed[next(iter(self._agreed))]

    def _keys_differ(self, every: list[tuple]) -> str:
        rank = dist.get_rank(self.group)
        global_ranks = None if self.group is None else dist.get_process_group_ranks(self.group)
        differences = [
            f"{name_ranks([other], global_ranks)} {_list_difference(listed, every[rank])}"
            for other, listed in enumerate(every)
            if listed != every[rank]
        ]
        return (
            f"gradients: ranks give different keys to reduce together (this is "
            f"{this_rank(rank, global_ranks)}): {'; '.join(differences)}; every rank must "
            f"give the same keys, of the same shapes, in the same order"
        )

    def _write_back(self, keys, gradients, stacked, factors, average, local) -> None:
        """Each gradient gets ``average`` (``(left, right)``: ``left @ right^T``) written
        into it; with error feedback, ``stacked`` (M, held in the error buffers) becomes
        ``M - local`` in place."""
        # NaN/Inf in any gradient reach the factors (a full pass over the approximation
        # would cost more than computing it)
        finite = torch.ones(len(keys), dtype=torch.bool, device=stacked.device)
        for factor in factors.values():
            finite &= torch.isfinite(factor).flatten(1).all(dim=1)
        finite = finite.tolist()
        left, right = average
        for position, (key, gradient) in enumerate(zip(keys, gradients, strict=True)):
            _write_product(left[position], right[position], gradient)
            if not finite[position]:  # NaN/Inf reached the gradient; start this matrix afresh
                self.stats.nonfinite_matrices += 1
                self.states[key] = self._fresh_state(key, *stacked.shape[1:], stacked.device)
                continue
            for name, value in factors.items():
                if not name.startswith("_"):
                    self.states[key][name] = value[position]
        if self.algorithm.error_feedback:
            local_left, local_right = local
            stacked.baddbmm_(local_left, local_right.transpose(1, 2), alpha=-1)

    def _error_stack(self, keys: list, states: list[dict]) -> torch.Tensor:
        """The error buffers of ``keys`` as one ``(b, n, m)`` tensor whose rows *are* the
        buffers, so that M and the new error are computed in place. Built (one copy) the
        first time a group of keys is seen, or after a buffer was replaced."""
        group = tuple(keys)
        stack = self._error_stacks.get(group)
        if stack is None or any(
            state["error"].data_ptr() != stack[position].data_ptr()
            for position, state in enumerate(states)
        ):
            for stale in [other for other in self._error_stacks if set(other) & set(group)]:
                self._unstack(stale, keep=set(stale) - set(group))
            stack = torch.stack([state["error"] for state in states])
            for position, state in enumerate(states):
                state["error"] = stack[position]
            self._error_stacks[group] = stack
        return stack

    def _unstack(self, group: tuple, keep: set) -> None:
        """Drop the error stack of ``group``; the buffers of its keys in ``keep`` that are
        still its rows get memory of their own (a row keeps the whole stack alive)."""
        stack = self._error_stacks.pop(group)
        for position, key in enumerate(group):
            error = self.states.get(key, {}).get("error")
            if key in keep and error is not None and error.data_ptr() == stack[position].data_ptr():
                self.states[key]["error"] = error.clone()

    def _buffer(self, name: str, shape: tuple[int, ...], slot: int, device) -> torch.Tensor:
        """Scratch reused from step to step: fresh memory costs a page fault per page, which
        on the project's VM made a step of a 13M-parameter model 0.3 s slower. One per
        matrix shape, grown to the most matrices asked for at once: parts of other sizes
        (a change of bucketing) share it."""
        count, *matrix = shape
        key = (name, tuple(matrix), slot, device)
        buffer = self._buffers.get(key)
        if buffer is None or len(buffer) < count:
            del buffer  # let the smaller one go before the larger one is allocated
            self._buffers.pop(key, None)
            self._buffers[key] = buffer = torch.empty(shape, device=device, dtype=FP32)
        return buffer[:count]

    def _check_fits(self, key, n: int, m: int) -> None:
        """Refuse a key whose state is of another shape; called for every key of a part
        before :meth:`_state` makes any, so that a refused part leaves no state behind."""
        state = self.states.get(key)
        if state is not None:
            _check_state_fits(key, state, n, m, self.algorithm.rank)

    def _state(self, key, n: int, m: int, device) -> dict[str, torch.Tensor]:
        if key not in self.states:
            self.states[key] = self._fresh_state(key, n, m, device)
        state = self.states[key]
        if any(tensor.device != device for tensor in state.values()):
            state = self.states[key] = _moved(state, device)
        return state

    def _fresh_state(self, key, n: int, m: int, device) -> dict[str, torch.Tensor]:
        """Drawn on the CPU (the same numbers on every rank), kept on ``device``: for a
        name, from a generator of its own, whatever order the names first come in (DDP's
        first buckets give them in another than its rebuilt ones, and a resumed run's
        first step has the first); for any other key, which may print differently in each
        process, in the order the keys first come."""
        seed = seed_of(
            "commpress-lowrank-initial-factors", self.algorithm.seed, *self._identity(key)
        )
        factors = self.algorithm.initial_factors(n, m, torch.Generator().manual_seed(seed))
        state = {name: factor.to(device, FP32) for name, factor in factors.items()}
        if self.algorithm.error_feedback:
            state["error"] = torch.zeros(n, m, device=device, dtype=FP32)
        return state

    def _identity(self, key) -> Identity:
        """How ``key``'s matrix is known to its random draws: by its name, or, for a key that
        is none (it may print differently in each process), by the order keys first came
        in."""
        if isinstance(key, str):
            return ("name", key)
        return ("unnamed", self._unnamed.setdefault(key, len(self._unnamed)))

    def _lap(self, stage: str, since: float) -> None:
        self.stats.seconds[stage] += time.perf_counter() - since

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Factors and error buffers are this rank's (the buffers differ between ranks): they
        are under its rank's key, in a tuple. torch.distributed.checkpoint saves one rank's
        copy of what every rank holds under one key, a tuple whole, as one object, and loads
        it into a fresh reducer's ``state_dict``, which has no tensors to load into yet."""
        self._check_not_failed()  # its buffers are half a step's: no checkpoint to resume from
        if any(not isinstance(key, str) for key in self.states):
            raise TypeError("state_dict needs string keys (parameter names) for every gradient")
        return {
            "algorithm": self.algorithm.name,
            "rank": self.algorithm.rank,
            "error_feedback": self.algorithm.error_feedback,
            "world_size": _world_size(self.group),
            "step": self.step,
            "states_of_rank": {str(_process_rank() or 0): (_cloned(self.states),)},
        }

    def load_state_dict(self, state: dict) -> None:
        check_checkpoint(state)
        if (state["algorithm"], state["rank"]) != (self.algorithm.name, self.algorithm.rank):
            raise ValueError(
                f"checkpoint is for {state['algorithm']} rank {state['rank']}, this reducer "
                f"runs {self.algorithm.name} rank {self.algorithm.rank}"
            )
        saved = self._own_states(state)
        self.step = state["step"]
        self.states = _cloned(saved)
        self._loaded = True
        self._error_stacks.clear()
        self._keys_this_step.clear()

    def _own_states(self, state: dict) -> dict:
        """This rank's states in ``state``: under its process rank's key (each rank's, in
        what torch.distributed.checkpoint saved; the rank in the world, since ranks of
        several groups save into one checkpoint), or under the one key there is where they
        can be: without error feedback (the factors are the same on every rank), or before
        ``init_process_group``. A checkpoint from before the rank keyed them holds them
        under ``"states"`` and says which rank of the reducer's group saved them in
        ``"group_rank"``."""
        if "states_of_rank" in state:
            saved_ranks = {int(rank): states for rank, (states,) in state["states_of_rank"].items()}
            here, ranks_of = _process_rank(), "the world"
        else:
            saved_ranks = {state.get("group_rank"): state["states"]}
            here, ranks_of = _group_rank(self.group), "the reducer's group"
        if not any(saved_ranks.values()):
            return {}
        # checkpoints before the flag was saved: error feedback keeps an "error" per state
        fed_back = state.get(
            "error_feedback",
            any("error" in s for states in saved_ranks.values() for s in states.values()),
        )
        if fed_back != self.algorithm.error_feedback:
            raise ValueError(
                f"checkpoint was saved with error_feedback={fed_back}, this reducer runs "
                f"error_feedback={self.algorithm.error_feedback}"
            )
        if fed_back:  # error feedback is one rank's own, in a world of one size
            self._check_same_world_size(state)
        if here in saved_ranks:
            return saved_ranks[here]
        if len(saved_ranks) == 1 and (here is None or None in saved_ranks or not fed_back):
            return next(iter(saved_ranks.values()))
        saved = ", ".join(map(str, sorted(saved_ranks)))
        raise ValueError(
            f"checkpoint was saved by rank {saved} of {ranks_of}, this is "
            f"rank {here}: its error feedback is rank {saved}'s own (each rank loads "
            f"the checkpoint it saved: {EACH_RANK_ITS_OWN})"
        )

    def _check_same_world_size(self, state: dict) -> None:
        """Refuse error feedback saved in a world of another size; unknown (None) in a
        checkpoint from before it was saved, or before ``init_process_group``, and then not
        checked."""
        saved_size, size = state.get("world_size"), _world_size(self.group)
        if None not in (saved_size, size) and saved_size != size:
            raise ValueError(
                f"checkpoint was saved by one of {counted(saved_size, 'rank')}, this reducer "
                f"averages over {size}: its error feedback is that rank's own "
                f"(save and load one checkpoint per rank, in a world of the same size)"
            )

    def _adopt_loaded(self) -> None:
        """States that :meth:`load_state_dict` cloned on CUDA belong to the stream current
        then; the scheduler's stream reads them later and then drops them (a step replaces
        factors and stacks the error buffers), and without a record of that use the
        allocator would hand their memory back to the loading stream (backward's) before
        the reads ran. Recorded once, on the stream that plans the first part after a load."""
        if not self._loaded:
            return
        self._loaded = False
        for state in self.states.values():
            for tensor in state.values():
                if tensor.is_cuda:
                    tensor.record_stream(torch.cuda.current_stream(tensor.device))


#: What every checkpoint of :meth:`Reducer.state_dict` holds (older ones lack the others,
#: and hold ``"states"`` for ``"states_of_rank"``; those before the initial factors were
#: drawn per key also hold a ``"generator"``, which nothing reads any more).
CHECKPOINT_KEYS = ("algorithm", "rank", "step", "states_of_rank")


def check_checkpoint(state) -> None:
    """Refuse what is not a low-rank ``state_dict`` (the model's, an optimizer's, a whole
    checkpoint), which raised a KeyError naming one of its missing keys."""
    if not isinstance(state, Mapping):
        raise TypeError(
            f"state must be the dict a low-rank state_dict() returned, got {type(state).__name__}"
        )
    missing = [key for key in CHECKPOINT_KEYS if key not in state]
    if "states" in state:  # a checkpoint from before the rank keyed the states
        missing = [key for key in missing if key != "states_of_rank"]
    if missing:
        keys = ", ".join(map(repr, list(state)[:5])) + (" ..." if len(state) > 5 else "")
        raise ValueError(
            f"not a low-rank state_dict: it lacks {', '.join(map(repr, missing))} (its keys: "
            f"{keys or 'none'}); load what the hook's or reducer's state_dict() returned"
        )


def frameless(error: BaseException) -> BaseException:
    """A copy of ``error``, of its cause and of its context, without their tracebacks, to
    keep or to hand on, with where it was raised as a note (text: it holds no frame). The
    frames of a traceback hold the hook's state, and up the training thread's stack DDP and
    the model, while torch's C++ holds, out of the garbage collector's sight, the error a
    future fails with and DDP's hook state: a failed step's state stayed for as long as the
    process ran, with its reducer, its thread, and serially the model."""
    where = "".join(traceback.format_exception(error)).rstrip()
    copied = _copy_without_frames(error, {})
    add_note(copied, f"where it was raised (the frames are not kept):\n{where}")
    return copied


def _copy_without_frames(error: BaseException, copies: dict) -> BaseException:
    """``error`` copied without calling its ``__init__`` (which may format its arguments
    again), its attributes and notes kept; its cause and context copied likewise."""
    if id(error) in copies:
        return copies[id(error)]
    try:
        copied = type(error).__new__(type(error), *error.args)
        copied.args = error.args
        copied.__dict__.update(getattr(error, "__dict__", {}))
    except Exception:  # noqa: BLE001 - a type that cannot be made so
        copied = RuntimeError(f"{type(error).__name__}: {error}")
    copies[id(error)] = copied
    if error.__cause__ is not None:
        copied.__cause__ = _copy_without_frames(error.__cause__, copies)
    if error.__context__ is not None:
        copied.__context__ = _copy_without_frames(error.__context__, copies)
    copied.__suppress_context__ = error.__suppress_context__
    if getattr(error, "__notes__", None) is not None:
        copied.__notes__ = list(error.__notes__)
    return copied.with_traceback(None)


def not_dense(key, layout) -> str:
    return (
        f"gradient {key!r} is a {layout} tensor: low-rank compression averages dense "
        f"gradients only (nn.Embedding(sparse=True) and the like: use dense gradients)"
    )


def not_real(key, dtype) -> str:
    return (
        f"parameter {key!r} is {dtype}: low-rank compression averages real gradients only "
        f"(DDP hands a complex one as a real view of half of it; use torch.view_as_real "
        f"parameters, or cp.ddp.hook, which averages the whole bucket)"
    )


#: How a state with error feedback is saved.
EACH_RANK_ITS_OWN = (
    "torch.save, one file per rank, or torch.distributed.checkpoint, which saves each "
    "rank's under its rank"
)


def checkpoint_names(state: dict) -> set:
    """The keys (parameter names) that ``state``, a checkpoint, holds state for, whichever
    rank's."""
    if "states" in state:
        return set(state["states"])
    return {key for (states,) in state["states_of_rank"].values() for key in states}


def _moved(state: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """``state`` on the gradient's ``device``: a checkpoint loaded elsewhere
    (``torch.load(..., map_location="cpu")``, another GPU) holds its factors and error
    buffers where it was loaded."""
    return {name: tensor.to(device) for name, tensor in state.items()}


def _cloned(states: dict) -> dict:
    return {key: {name: t.clone() for name, t in state.items()} for key, state in states.items()}


def _world_size(group) -> int | None:
    """The group's size; None before the process group is initialized."""
    return dist.get_world_size(group) if dist.is_initialized() else None


def _process_rank() -> int | None:
    """This process's rank in the world; None before the process group is initialized."""
    return dist.get_rank() if dist.is_initialized() else None


def _group_rank(group) -> int | None:
    """This process's rank in the group; None before the process group is initialized."""
    return dist.get_rank(group) if dist.is_initialized() else None


def _pairs(gradients) -> list[tuple[Hashable, torch.Tensor]]:
    """``gradients`` as a list of ``(key, gradient)`` pairs. A tensor in place of a pair
    was unpacked along its rows: ``[grad]`` of a 2-row gradient averaged its second row
    under its first as the key, silently; a dict gave its keys' characters."""
    if isinstance(gradients, (Mapping, torch.Tensor)):
        raise TypeError(
            f"gradients must be (key, tensor) pairs, such as list(grads.items()), "
            f"got a {type(gradients).__name__}"
        )
    pairs = list(gradients)
    for pair in pairs:
        if isinstance(pair, torch.Tensor) or not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"gradients must be (key, tensor) pairs, such as list(grads.items()), got an "
                f"item of type {type(pair).__name__}"
            )
    return [tuple(pair) for pair in pairs]


def _shares_elements(tensor: torch.Tensor) -> bool:
    """Whether elements of ``tensor`` are one place in memory, which torch refuses to write
    in place (a stride 0 along a dimension of more than one element)."""
    shape, strides = tensor.shape, tensor.stride()
    return any(size > 1 and stride == 0 for size, stride in zip(shape, strides, strict=True))


def _label(key) -> str:
    """How ``key`` is named to the other ranks: its repr, but for what prints otherwise in
    each process, named by its type alone: an object without a repr of its own (its
    address), a tensor or parameter (its values, on a GPU its device); tuples part by
    part."""
    if isinstance(key, tuple):
        return f"({', '.join(map(_label, key))})"
    if isinstance(key, torch.Tensor) or type(key).__repr__ is object.__repr__:
        return f"<{type(key).__name__}>"
    return repr(key)


def _list_difference(theirs: tuple, mine: tuple) -> str:
    """How another rank's list of ``(key, shape)`` differs from this rank's, in words."""
    their_shapes, my_shapes = dict(theirs), dict(mine)
    said = []
    if extra := [key for key in their_shapes if key not in my_shapes]:
        said.append(f"gives {', '.join(extra)}, which this rank does not")
    if lacking := [key for key in my_shapes if key not in their_shapes]:
        said.append(f"lacks {', '.join(lacking)}, which this rank gives")
    for key, shape in their_shapes.items():
        if key in my_shapes and my_shapes[key] != shape:
            said.append(f"gives {key} of shape {shape}, this rank of {my_shapes[key]}")
    if not said:
        said.append(
            f"gives them in another order: {', '.join(their_shapes)} (this rank: "
            f"{', '.join(my_shapes)})"
        )
    return "; ".join(said)


def _check_state_fits(key, state: dict[str, torch.Tensor], n: int, m: int, rank: int) -> None:
    """A state made for another shape (a checkpoint of another model, one key given two
    tensors) failed deep inside a batched product, naming no gradient."""
    expected = {"error": (n, m), "p": (n, rank), "q": (m, rank)}
    for name, tensor in state.items():
        if name in expected and tuple(tensor.shape) != expected[name]:
            raise ValueError(
                f"gradient {key!r} is a {n} x {m} matrix, but its low-rank state {name!r} "
                f"is {tuple(tensor.shape)}: loaded from a checkpoint of another model, or "
                f"the key was given another tensor before"
            )


def _write_product(left: torch.Tensor, right: torch.Tensor, gradient: torch.Tensor) -> None:
    """``gradient = left @ right^T`` (as a matrix), in place; straight into its memory when
    it is a contiguous fp32 tensor, else through a temporary."""
    if gradient.dtype == torch.float32 and gradient.is_contiguous():
        torch.mm(left, right.T, out=as_matrix(gradient))
    else:
        gradient.copy_((left @ right.T).view(gradient.shape))


def _scatter_back(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for tensor in tensors:
        tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()


class Part:
    """Averaging some gradients takes ``rounds`` all-reduces: for each, ``payload(round)``
    is the tensor to sum over ranks (None: nothing this round), ``take(round, sum)``
    uses the sum; ``finish()`` writes the gradients. The order of rounds is the same on
    every rank, which is what lets a scheduler interleave parts safely."""

    rounds = 1

    def payload(self, round_: int) -> torch.Tensor | None:
        raise NotImplementedError

    def take(self, round_: int, total: torch.Tensor) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Nothing by default: ``take`` already wrote everything."""


class UncompressedPart(Part):
    """A warm-up step: every gradient, fused, averaged in fp32 (float64 ones too)."""

    def __init__(self, reducer: Reducer, tensors: list[torch.Tensor], world_size: int):
        self.reducer, self.tensors, self.world_size = reducer, tensors, world_size

    def payload(self, round_):
        if not self.tensors:
            return None
        flat = torch.cat([t.reshape(-1).float() for t in self.tensors])
        self.reducer.stats.count_sent(flat.numel(), self.world_size)
        self.reducer.stats.count_raw(self.tensors, self.world_size)
        return flat

    def take(self, round_, total):
        _scatter_back(total / self.world_size, self.tensors)


class CompressedPart(Part):
    """Matrices grouped by shape and compressed; small tensors ride in round 0's payload."""

    def __init__(self, reducer: Reducer, compressed, plain, world_size: int, slot: int):
        self.reducer, self.plain, self.world_size, self.slot = reducer, plain, world_size, slot
        algorithm = reducer.algorithm
        self.step = reducer.step - algorithm.start_iter
        self.rounds = algorithm.rounds(self.step)
        clock = time.perf_counter()
        matrices = [as_matrix(g) for _, g in compressed]
        self.gradients = [g for _, g in compressed]
        self.batches = []
        groups = group_by_shape(matrices).items()
        for shape, indices in groups:  # refused before any state is made
            for i in indices:
                reducer._check_fits(compressed[i][0], *shape)
        every_state = [  # all found before any error buffer is added to
            [reducer._state(compressed[i][0], *shape, matrices[i].device) for i in indices]
            for shape, indices in groups
        ]
        for (shape, indices), states in zip(groups, every_state, strict=True):
            keys = [compressed[i][0] for i in indices]
            device = matrices[indices[0]].device
            if algorithm.error_feedback:  # M = error + gradient, in the error buffers
                stacked = reducer._error_stack(keys, states)
                for position, index in enumerate(indices):
                    stacked[position].add_(matrices[index])
            else:
                stacked = reducer._buffer("stacked", (len(indices), *shape), slot, device)
                for position, index in enumerate(indices):
                    stacked[position].copy_(matrices[index])
            # a key first seen now has only the initial factors, the others more (PowerSGD's p)
            names = [n for n in states[0] if n != "error" and all(n in s for s in states)]
            factors = {n: torch.stack([s[n] for s in states]) for n in names}
            self.batches.append((indices, keys, stacked, factors))
        self.plain_flat = torch.cat([t.reshape(-1).float() for t in plain]) if plain else None
        reducer.stats.count_raw(self.gradients + self.plain, world_size)
        self.parts: list[torch.Tensor] = []
        self.extra: list[torch.Tensor] = []
        reducer._lap("compress", clock)

    def payload(self, round_):
        clock, algorithm = time.perf_counter(), self.reducer.algorithm
        if round_ == 0:
            self._start()
        self.parts = [algorithm.factor(round_, self.step, m, f) for _, _, m, f in self.batches]
        self.extra = [self.plain_flat] if round_ == 0 and self.plain_flat is not None else []
        if not self.parts and not self.extra:
            return None  # nothing of this part is compressed, and the rest has travelled
        fused = torch.cat([p.reshape(-1) for p in self.parts] + self.extra)
        self.reducer.stats.count_sent(fused.numel(), self.world_size)
        self.reducer._lap("compress", clock)
        return fused

    def _start(self) -> None:
        """Each batch's starting factor warm-started or drawn afresh, each matrix by its own
        identity, whatever batch it is in."""
        algorithm, identity = self.reducer.algorithm, self.reducer._identity
        name = algorithm.starting_factor(self.step)
        for _, keys, _, factors in self.batches:
            identities = [identity(key) for key in keys]
            factors[name] = algorithm.start(factors[name], identities, self.step)

    def take(self, round_, total):
        clock, algorithm = time.perf_counter(), self.reducer.algorithm
        sizes = [p.numel() for p in self.parts] + [e.numel() for e in self.extra]
        sums = torch.split(total, sizes)
        for (_, _, _, factors), part, value in zip(self.batches, self.parts, sums, strict=False):
            algorithm.absorb(round_, self.step, value.view_as(part), factors, self.world_size)
        if self.extra:
            _scatter_back(sums[-1] / self.world_size, self.plain)
        self.reducer._lap("compress", clock)

    def finish(self):
        clock, reducer = time.perf_counter(), self.reducer
        algorithm = reducer.algorithm
        for indices, keys, stacked, factors in self.batches:
            average = algorithm.reconstruct(self.step, factors)
            local = algorithm.local_approximation(self.step, factors) or average
            gradients = [self.gradients[i] for i in indices]
            reducer._write_back(keys, gradients, stacked, factors, average, local)
        reducer._lap("reconstruct", clock)
