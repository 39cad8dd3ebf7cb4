"""``cp.fsdp.compress(model, ...)``: commpress collectives inside FSDP2 (``fully_shard``).

FSDP2 lets each ``FSDPModule`` replace its all-gather and reduce-scatter
(``set_custom_all_gather`` / ``set_custom_reduce_scatter``); ``compress`` installs
ours on every such module of a model. Every rank ends each all-gather with
bitwise-identical parameters: the ring forwards one encoding of each shard, and
the owner keeps the decoded copy of its own.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from commpress import _torch_private
from commpress.codecs import Codec, get_codec
from commpress.collectives import (
    ALL_GATHER_ALGORITHMS,
    REDUCE_SCATTER_ALGORITHMS,
    all_gather_into_tensor,
    auto,
    reduce_scatter_tensor,
)
from commpress.collectives.auto import AUTO
from commpress.collectives.checks import (
    check_flag,
    check_reduction_dtype,
    check_timeout,
    op_kind,
)
from commpress.collectives.failures import named_failures
from commpress.collectives.inband import call_wire_bytes
from commpress.collectives.work import CollectiveWork, launch
from commpress.integrations.groups import OwnGroups, exchange_with_every_rank
from commpress.integrations.spec import CollectiveSpec
from commpress.integrations.stats import CommStats, Stopwatch
from commpress.ranks import by_rank, check_saved_here, keyed_by_rank, own_entry
from commpress.schedules import wire_bytes
from commpress.schedules.registry import ERROR_FEEDBACK_ALGORITHMS, NATIVE
from commpress.sim import tuner
from commpress.transport import backends
from commpress.transport.p2p import wait as wait_work

try:
    AllGather, ReduceScatter = _torch_private.fsdp_comm_classes()
    _unavailable: _torch_private.PrivateAPIMissing | None = None
except _torch_private.PrivateAPIMissing as missing:  # DDP users must still import commpress
    AllGather, ReduceScatter, _unavailable = object, object, missing
MARK = "_commpress_fsdp"
LOSSLESS = get_codec("none")
ON_UNSUPPORTED = ("raise", "native")


@dataclass
class Compression:
    """What ``compress`` did: the modules it changed, those it left as they were
    (``on_unsupported="native"``), the counters."""

    modules: list[str]
    left_native: list[str]
    all_gather: CommStats = field(default_factory=CommStats)
    reduce_scatter: CommStats = field(default_factory=CommStats)
    #: commpress's own process group for each of FSDP's, so that torch's collectives on
    #: FSDP's groups never interleave with ours (which run on the communication thread).
    groups: OwnGroups | None = None
    error_feedback: bool = False
    #: the reduce-scatter of each module in ``modules`` that keeps a residual (error feedback)
    feedback: dict[str, CompressedReduceScatter] = field(default_factory=dict, repr=False)

    def state_dict(self) -> dict:
        """This rank's error-feedback residuals, by module name, with which parameters each
        came from: plain tensors, ints and bools under this rank's key
        (:func:`~commpress.ranks.keyed_by_rank`), for ``torch.save`` (one file per rank) or
        ``torch.distributed.checkpoint`` (which loads them into a fresh compression's
        ``state_dict`` too). Empty of residuals without error feedback."""
        rank = dist.get_rank()
        own = {
            "rank": rank,
            "world_size": dist.get_world_size(),
            "error_feedback": self.error_feedback,
            "residuals": {name: rs.residual_state() for name, rs in self.feedback.items()},
            "left_native": list(self.left_native),
        }
        return keyed_by_rank(own, rank)

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``, this rank's :meth:`state_dict` of a compression of the same
        model (module names) and ``error_feedback``; between steps (no backward running).
        Nothing is loaded where anything of it is refused."""
        state = own_state(state)
        check_state(state, self.error_feedback, list(self.feedback), self.left_native)
        loaded = {
            name: scatter.checked_residual_state(
                state["residuals"][name], f"state['residuals'][{name!r}]"
            )
            for name, scatter in self.feedback.items()
        }
        for name, (residual, residual_of) in loaded.items():
            self.feedback[name].restore_residual(residual, residual_of)


def cpu_mesh(group: dist.ProcessGroup | None = None) -> DeviceMesh:
    """``group`` (default: the whole world) as a CPU device mesh, for ``fully_shard(module,
    mesh=cpu_mesh())`` on gloo. Given no mesh, ``fully_shard`` shards on the accelerator
    whenever one is visible, so a CPU model fails on a machine with a GPU ("Expected all
    tensors to be on the same device")."""
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("group: this rank is not in it (new_group gave it NON_GROUP_MEMBER)")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup or None, got {group!r}")
    if not dist.is_initialized():
        raise ValueError("cpu_mesh needs torch.distributed initialised: call init_process_group")
    group = backends.or_world(group)
    if backends.moves(group, "cpu") != "gloo":
        raise ValueError(
            f"group's backend is {backends.name(group)!r}: a CPU mesh needs gloo to move its "
            "CPU tensors"
        )
    return DeviceMesh.from_group(group, "cpu")


def compress(
    model: torch.nn.Module,
    all_gather: str | Codec | None = "int8",
    reduce_scatter: str | Codec | None = "int8",
    *,
    error_feedback: bool = False,
    timeout: timedelta | None = None,
    on_unsupported: str = "raise",
    unshard_async_op: bool = False,
    keep: Iterable[str] = (),
) -> Compression:
    """Install commpress collectives on every ``FSDPModule`` in ``model`` (but those in
    ``keep``).

    ``all_gather`` / ``reduce_scatter``: ``"CODEC[:options][@ALGORITHM]"`` (``"int8"``,
    ``"int4@ring-hop"``, ``"int8@alltoall"``, ``"none"``), a codec object (over the ring),
    or None to keep FSDP's own;
    ``"auto"`` (or ``"auto:max_rel_err=1e-3"``, ``"int8@auto"``) lets the cost model choose
    per call (:mod:`commpress.sim.tuner`, where the network it assumes is set).
    ``error_feedback``: keep, per module, the reduce-scatter's rounding error of this
    rank's gradients and add it before the next compression (needs ``@alltoall``, where
    every rounding happens at the source; the returned ``Compression``'s ``state_dict()`` /
    ``load_state_dict()`` save and restore the residuals for a resumed run; FSDP2's
    ``reset_iter_state()``, which discards an aborted step's gradients, restarts every
    residual from zero).
    ``on_unsupported``: FSDP2 cannot customise a module with several parameter groups,
    one it replicates without sharding has nothing to compress, and one given collectives
    of its user's (``set_custom_all_gather`` / ``set_custom_reduce_scatter``, FSDP2's
    ``set_*_for_comm``) in a direction ``compress`` would replace keeps them;
    ``"raise"`` (default) says which, ``"native"`` leaves its collectives as they are
    with a warning and lists it in ``left_native``.
    ``keep``: the qualified names of FSDP modules (``"<root>"`` for ``model`` itself) that
    keep FSDP2's own collectives, e.g. an embedding and an output layer to gather at full
    precision; listed in ``left_native``. Every rank must give the same names.
    ``timeout``: how long each collective (``native`` included), and ``compress``'s own
    exchanges with the other ranks, wait for a peer that stalls or dies (None: the timeout
    of FSDP's process group, which commpress's twin of it is made with).

    ``unshard_async_op``: FSDP2 calls a module's all-gathers with ``async_op=False``
    unless told otherwise, and a compressed one, run on the communication thread, then
    blocks the training thread until it has finished. True has FSDP2 call the compressed
    all-gathers of ``model`` with ``async_op=True`` (what FSDP2's private
    ``_set_unshard_async_op`` sets) and wait where it needs the parameters, so that a
    prefetched one (in backward, or in forward after ``set_modules_to_forward_prefetch``)
    runs while the training thread goes on. On a GPU it also moves the copy-in and the
    all-gather's start onto the compute stream (FSDP2's own caveat): without forward
    prefetching, a forward all-gather then waits for the compute queued before it.
    """
    if _unavailable is not None:
        raise _unavailable
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (after fully_shard), got {model!r}")
    check_timeout(timeout)
    check_flag(error_feedback, "error_feedback")
    check_flag(unshard_async_op, "unshard_async_op")
    if on_unsupported not in ON_UNSUPPORTED:
        raise ValueError(f"on_unsupported must be one of {ON_UNSUPPORTED}, got {on_unsupported!r}")
    gather = _parse(all_gather, ALL_GATHER_ALGORITHMS, "all_gather", gathers=True)
    scatter = _parse(reduce_scatter, REDUCE_SCATTER_ALGORITHMS, "reduce_scatter", gathers=False)
    if gather is None and scatter is None:
        raise ValueError("all_gather and reduce_scatter are both None: nothing to compress")
    if gather is not None:
        check_all_gather_codec(gather, "all_gather")
    if unshard_async_op and gather is None:
        raise ValueError("unshard_async_op=True concerns the all-gathers: all_gather is None")
    feeds_back = (*ERROR_FEEDBACK_ALGORITHMS, AUTO)
    if error_feedback and (scatter is None or scatter.algorithm not in feeds_back):
        raise ValueError(
            "error_feedback needs reduce_scatter='CODEC@alltoall': only there does every "
            f"rounding happen on the rank that owns the gradient (got {reduce_scatter!r})"
        )
    modules = [
        (name or "<root>", m) for name, m in model.named_modules() if isinstance(m, FSDPModule)
    ]
    if not modules:
        raise ValueError(
            f"{type(model).__name__} has no FSDP modules: apply "
            "torch.distributed.fsdp.fully_shard to it (and its blocks) first"
        )
    problem, unsupported, kept = None, {}, set()
    try:
        kept = _kept_names(keep, modules)
        compressed_modules = [(name, m) for name, m in modules if name not in kept]
        unsupported = _check_modules(
            compressed_modules, gather, scatter, error_feedback, on_unsupported
        )
    except (ValueError, TypeError) as error:
        problem = error
    try:
        _raise_on_every_rank(problem, timeout, kept)
    finally:
        problem = None  # a refusal's traceback holds this frame
    fsdp_groups = [
        pg
        for _, m in modules
        for g in _torch_private.fsdp_param_groups(m)
        for pg in g.process_groups
    ]
    result = Compression(
        modules=[],
        left_native=[],
        groups=OwnGroups(fsdp_groups, timeout),
        error_feedback=error_feedback,
    )
    for name, module in modules:
        if name in kept:
            result.left_native.append(name)
            continue
        if name in unsupported:
            warnings.warn(f"commpress: module {name!r} {unsupported[name]}", stacklevel=2)
            result.left_native.append(name)
            continue
        if gather is not None:
            compressed = CompressedAllGather(
                gather, result.all_gather, timeout, name, result.groups, _regather_ranks(module)
            )
            module.set_custom_all_gather(compressed)
            if unshard_async_op:
                _torch_private.unshard_asynchronously(module)
        if scatter is not None:
            compressed = CompressedReduceScatter(
                scatter, result.reduce_scatter, timeout, name, error_feedback, result.groups
            )
            module.set_custom_reduce_scatter(compressed)
            if error_feedback:
                _torch_private.before_post_backward(module, compressed.note_reduced)
                _torch_private.after_reset_iter_state(module, compressed.discard_step)
                compressed.numels = _torch_private.reduce_scatter_numels(module)
                result.feedback[name] = compressed
        setattr(module, MARK, True)
        result.modules.append(name)
    return result


def _check_modules(modules, gather, scatter, error_feedback, on_unsupported) -> dict[str, str]:
    """Raise where a module cannot be compressed as asked; the names of those whose
    collectives FSDP2 cannot customise (several parameter groups), that it does not shard
    (replicated only) or that have collectives of their user's, which ``on_unsupported``
    leaves as they are, each with what that means and why."""
    unsupported = {}
    for name, module in modules:
        if getattr(module, MARK, False):
            raise ValueError(
                f"module {name!r} is already compressed: a module takes one compress (another "
                "compress of the model names it in keep=[...])"
            )
        groups = _torch_private.fsdp_param_groups(module)
        if len(groups) > 1 and on_unsupported == "raise":
            raise ValueError(
                f"module {name!r} has {len(groups)} parameter groups (a per-parameter mesh, "
                "from shard_placement_fn), whose collectives FSDP2 cannot customise: give it "
                "one mesh, or compress(..., on_unsupported='native') to leave it on torch's"
            )
        replicated = any(not group.sharded_by_fsdp for group in groups)
        if replicated and on_unsupported == "raise":
            raise ValueError(
                f"module {name!r} is replicated, not sharded (a mesh without a shard "
                "dimension, from a replicate-only dp_mesh_dims): FSDP2 all-reduces its "
                "gradients with torch's all-reduce and has no all-gather or reduce-scatter to "
                "compress; shard it, or compress(..., on_unsupported='native') to leave it "
                "on torch's"
            )
        own = _own_collectives(module, gather, scatter)
        if own and on_unsupported == "raise":
            raise ValueError(
                f"module {name!r} has {own} set on it (set_custom_all_gather / "
                "set_custom_reduce_scatter, or FSDP2's set_*_for_comm), which compress would "
                "replace: pass None for that direction to keep it, or compress(..., "
                "on_unsupported='native') to leave this module's collectives as they are"
            )
        if len(groups) > 1:
            unsupported[name] = (
                "keeps torch's collectives: FSDP2 cannot customise those of a module with "
                "several parameter groups"
            )
        elif replicated:
            unsupported[name] = (
                "keeps torch's collectives: it is replicated, not sharded, and FSDP2 all-reduces it"
            )
        elif own:
            unsupported[name] = f"keeps its collectives as they are: it has {own} set on it"
        else:
            _check_dtypes(name, module, gather, scatter, error_feedback)
    return unsupported


def _own_collectives(module, gather, scatter) -> str:
    """The collectives set on ``module`` (by its user) that ``compress`` would replace, in
    words: ``"its own all-gather (MyAllGather)"``; empty where there are none."""
    own = [
        f"{which.replace('_', '-')} ({type(comm).__name__})"
        for which, spec in (("all_gather", gather), ("reduce_scatter", scatter))
        if spec is not None
        and (comm := _torch_private.replaced_collective(module, which)) is not None
    ]
    return f"its own {' and '.join(own)}" if own else ""


STATE_KEYS = ("rank", "world_size", "error_feedback", "residuals")


def own_state(state: object) -> dict:
    """This rank's state in ``state``, a :meth:`Compression.state_dict`."""
    return own_entry(state, dist.get_rank(), "Compression.state_dict()")


def check_state(
    state: object, error_feedback: bool, modules: list[str], left_native: list[str] = ()
) -> None:
    """``state`` must be a :meth:`Compression.state_dict` of this rank and world, saved with
    ``error_feedback`` as given, holding a residual of each of ``modules`` and of no other
    (this rank's entry of it, a dict: :func:`own_state`); a module of the one side's
    ``left_native`` (``keep``) that the other compresses is named as such."""
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"state is not a Compression.state_dict(): it lacks {missing}")
    check_saved_here(
        state,
        dist.get_rank(),
        dist.get_world_size(),
        "a residual is what one rank's gradients lost",
    )
    if state["error_feedback"] != error_feedback:
        if error_feedback:
            raise ValueError(
                "state was saved without error feedback (no residuals), and this compression "
                "keeps them: save it from cp.fsdp.compress(..., error_feedback=True)"
            )
        raise ValueError(
            "state holds error-feedback residuals, and this compression was made without "
            "error_feedback: compress with error_feedback=True to continue them"
        )
    residuals = state["residuals"]
    if not isinstance(residuals, dict):
        raise TypeError(
            f"state['residuals'] must be a dict of module names, got {type(residuals).__name__}"
        )
    lacking = [name for name in modules if name not in residuals]
    saved_native = state.get("left_native")  # None in a state from before it was saved
    if lacking and saved_native is not None and set(lacking) <= set(saved_native):
        said = f"state has no residual of modules {lacking}, which the compression that saved"
        raise ValueError(_keep_differs(f"{said} it left native", saved_native, left_native))
    if lacking:
        raise ValueError(
            f"state has no residual of modules {lacking} of this model: a state of another model"
        )
    extra = [name for name in residuals if name not in modules]
    if extra and set(extra) <= set(left_native):
        said = f"state has residuals of modules {extra}, which this compression leaves native"
        raise ValueError(_keep_differs(said, saved_native, left_native))
    if extra:
        raise ValueError(
            f"state has residuals of modules {extra} that this model does not compress: a "
            "state of another model"
        )


def _keep_differs(said: str, saved_native: list | None, left_native: list[str]) -> str:
    saved = "" if saved_native is None else f"saved with {_kept(saved_native)}, "
    return (
        f"{said}: keep differs ({saved}this compression {_kept(left_native)}; keep=, or "
        f"on_unsupported='native', leaves a module native)"
    )


def _kept(left_native) -> str:
    """'modules ['0', '4'] left native', or 'no module left native'."""
    return f"modules {sorted(left_native)} left native" if left_native else "no module left native"


def _regather_ranks(module) -> tuple[int, ...] | None:
    """The ranks of the group on which FSDP2 all-gathers ``module``'s decoded parameters
    again (an int ``reshard_after_forward``), or None."""
    for group in _torch_private.fsdp_param_groups(module):
        if group.regather_group is not None:
            return tuple(dist.get_process_group_ranks(group.regather_group))
    return None


def _kept_names(keep: Iterable[str], modules: list[tuple[str, torch.nn.Module]]) -> set[str]:
    """``keep`` as a set of the FSDP modules' names, each checked to be one, and not all."""
    if isinstance(keep, str) or not isinstance(keep, Iterable):
        raise TypeError(f"keep must be a list of module names, got {keep!r}")
    given = list(keep)
    if not all(isinstance(name, str) for name in given):
        raise TypeError(f"keep must be a list of module names (str), got {given!r}")
    names = [name for name, _ in modules]
    unknown = sorted(set(given) - set(names))
    if unknown:
        shown = ", ".join(map(repr, names[:8])) + (", ..." if len(names) > 8 else "")
        what = "an FSDP module" if len(unknown) == 1 else "FSDP modules"
        raise ValueError(
            f"keep names {', '.join(map(repr, unknown))}: not {what} of the model (those "
            f"are {shown})"
        )
    if set(given) == set(names):
        raise ValueError("keep names every FSDP module of the model: nothing to compress")
    _check_units_whole(set(given), modules)
    return set(given)


def _check_units_whole(kept: set[str], modules: list[tuple[str, torch.nn.Module]]) -> None:
    """The modules of one ``fully_shard([m1, m2])`` call share one FSDP state, and so one
    set of collectives: ``keep`` must name all of them or none (compressing one compresses
    the others)."""
    units: dict[int, list[str]] = {}
    for name, module in modules:
        units.setdefault(id(_torch_private.fsdp_state(module)), []).append(name)
    for unit in units.values():
        named = [name for name in unit if name in kept]
        if named and len(named) != len(unit):
            others = [name for name in unit if name not in kept]
            raise ValueError(
                f"keep names {', '.join(map(repr, named))} and not "
                f"{', '.join(map(repr, others))}, which fully_shard made one FSDP unit with "
                "it (fully_shard([...]) of several modules): they share one set of "
                "collectives, so keep all of them or none"
            )


def _raise_on_every_rank(
    problem: Exception | None, timeout: timedelta | None, kept: set[str]
) -> None:
    """Every rank raises where any rank's checks failed (a collective call, before the
    twins' set-up, which would leave the others waiting for a rank that failed alone: one
    given tuner settings of its own, say), or where the ranks keep different modules
    native (their collectives would run on different groups, until the timeout); this
    rank raises its own error as it is."""
    mine = None if problem is None else f"{type(problem).__name__}: {problem}"
    said = exchange_with_every_rank((mine, sorted(kept)), timeout, "fsdp.compress")
    if problem is not None:
        try:
            raise problem
        finally:
            problem = None  # its traceback holds this frame
    failed = by_rank([error for error, _ in said])
    if failed:
        raise ValueError(f"cp.fsdp.compress failed on another rank, so on every rank ({failed})")
    if any(names != sorted(kept) for _, names in said):
        keeps = by_rank([f"keep={names}" for _, names in said])
        raise ValueError(f"cp.fsdp.compress keeps other modules on other ranks: {keeps}")


def check_all_gather_codec(spec: CollectiveSpec, argument: str) -> None:
    """FSDP2 all-gathers a module's parameters again for backward: a codec that rounds
    stochastically would hand backward other values than forward. A tuned codec
    (``auto:codecs=...``) may become any of its candidates."""
    codecs = [spec.codec]
    if tuner.is_auto(spec.codec):
        codecs = [get_codec(name) for name in tuner.budget(spec.codec)[1]]
    if any(getattr(codec, "draws_noise", False) for codec in codecs):
        raise ValueError(
            f"{argument}={spec.text!r}: FSDP2 all-gathers the parameters again for backward "
            "(after reshard_after_forward, and for recomputed activations), and stochastic "
            "rounding would give them other values than forward's; round to nearest in the "
            "all-gather (stochastic rounding suits the reduce-scatter)"
        )


def _parse(spec, algorithms, argument, gathers) -> CollectiveSpec | None:
    if spec is None:
        return None
    return CollectiveSpec.parse(spec, algorithms, argument, gathers=gathers, tunable=True)


def _check_dtypes(name, module, gather, scatter, error_feedback) -> None:
    """The dtypes FSDP will hand each collective must be ones the codec can encode; a tuned
    spec must leave the tuner a candidate on each of the module's groups (an auto codec's
    budget within reach, an algorithm for error feedback): checked here, not in the first
    backward."""
    for group in _torch_private.fsdp_param_groups(module):
        policy = group.mp_policy
        dtypes, reduced = set(), set()  # all-gathered; reduce-scattered (having gradients)
        for sharded in group.sharded:
            original = sharded.dtype
            cast = policy.param_dtype is not None and original.is_floating_point
            dtypes.add(policy.param_dtype if cast else original)
            if sharded.requires_grad:
                reduced.add(policy.param_dtype if cast else original)
        _check_tuned(name, group, dtypes, reduced, gather, scatter, error_feedback)
        # a tuned spec takes only codecs that encode the dtype it is handed: nothing to check
        gather = None if gather is not None and tuner.is_auto(gather.codec) else gather
        scatter = None if scatter is not None and tuner.is_auto(scatter.codec) else scatter
        if gather is not None and not gather.codec.lossless and len(dtypes) > 1:
            raise TypeError(
                f"module {name!r}: parameters of several dtypes {sorted(map(str, dtypes))} are "
                "all-gathered as raw bytes, which a lossy codec cannot encode; give them one "
                "dtype (MixedPrecisionPolicy) or use all_gather='none'"
            )
        for dtype in dtypes:
            if gather is not None:
                gather.codec.check_dtype(dtype, f"module {name!r} all-gather dtype")
            if scatter is not None and dtype in reduced:
                reduce_dtype = policy.reduce_dtype or dtype
                argument = f"module {name!r} reduce-scatter dtype"
                if scatter.algorithm not in (NATIVE, AUTO):  # the tuner picks native for it
                    check_reduction_dtype(reduce_dtype, argument)  # first: it names the way out
                scatter.codec.check_dtype(reduce_dtype, argument)


def _check_tuned(name, group, dtypes, reduced, gather, scatter, error_feedback) -> None:
    """``dtypes``: those all-gathered; ``reduced``: those reduce-scattered."""
    on_cpu = all(sharded.device.type == "cpu" for sharded in group.sharded)
    for spec, op, handed in ((gather, "all_gather", dtypes), (scatter, "reduce_scatter", reduced)):
        if spec is None or not spec.tuned:
            continue
        feedback = error_feedback and op == "reduce_scatter"
        for dtype in handed:
            if op == "reduce_scatter":
                dtype = group.mp_policy.reduce_dtype or dtype
            for pg in group.process_groups:
                try:
                    tuner.check(op, dtype, dist.get_world_size(pg), spec.codec, spec.algorithm,
                                on_cpu=on_cpu, backend=backends.name(pg),
                                error_feedback=feedback,
                                placement=auto.placement(pg))  # fmt: skip
                except ValueError as error:
                    raise ValueError(f"module {name!r} {op.replace('_', '-')}: {error}") from None


def _resolve(
    spec: CollectiveSpec,
    op,
    tensor,
    group,
    groups: OwnGroups,
    timeout,
    feedback=False,
    reduce_op=None,
    *,
    module_name: str,
):
    """``spec``'s ``(algorithm, codec)`` for one call on FSDP's ``group``; a tuned spec is
    resolved on commpress's twin, where its compressed collectives run (a multicast with
    the twin's own options) and where its ranks agree on the choice (and ``reduce_op``)."""
    where = groups.twin(group) if spec.tuned else group
    try:
        return spec.resolve(op, tensor, where, feedback, reduce_op, timeout)
    except TypeError as error:  # a dtype no candidate takes (cast after compress)
        raise TypeError(
            f"module {module_name!r} {op.replace('_', '-')} of {tensor.dtype}: {error}"
        ) from error


def _wait_native(name: str, codec, group, timeout, issued: float, work) -> None:
    """Wait for torch's own collective (``native``), ``issued`` at that ``time.monotonic()``,
    for at most ``timeout``, its failure named as a compressed collective's."""
    with named_failures(name, codec, "native", group, timeout, since=issued):
        wait_work(work, timeout)


def _finish(work, watch: Stopwatch, async_op: bool, tensor: torch.Tensor, wait_native, group):
    """Time the collective to completion; block, or hand FSDP a ``Work`` to wait on; torch's
    own (``native``) on ``group`` is waited for by ``wait_native(work)`` where gloo moves it.

    Waiting on either makes the waiter's current CUDA stream wait for the collective
    (``tensor``, the output, is the future's value: on CUDA its device is what is waited for).
    """
    if not isinstance(work, CollectiveWork):  # torch's own ("native")
        if tensor.is_cuda and backends.moves(group, "cuda") == "nccl":
            # NCCL's Work keeps the stream contract itself, and has a future (gloo's
            # reduce-scatter has none, CUDA tensors or not)
            work.get_future().then(watch.stop)
            if async_op:
                return work
            work.wait()
            return None
        native = work
        # gloo's Work waited on the comm stream (CUDA tensors) orders that stream after it
        work = launch(lambda: wait_native(native), async_op=True, tensors=(tensor,))
    future = work.torch_future(tensor, before=watch.stop)
    if not async_op:
        future.wait()
        return None
    return FutureWork(future, work)


class FutureWork(dist.Work):
    """The ``Work`` FSDP2 waits on: ``wait()`` re-raises the collective's error. (torch's
    ``_create_work_from_future`` returns True from ``wait()`` for a failed future too, and
    FSDP2 then went on with the all-gather's uninitialised output.) ``wait(timeout)`` raises
    ``TimeoutError`` if ``work`` (the collective) has not finished within it; a zero
    timeout is torch's "none" (what its C++ passes for ``wait()``)."""

    def __init__(self, future: torch.futures.Future, work: CollectiveWork) -> None:
        super().__init__()
        self._future, self._work = future, work

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._work.wait(timeout or None)  # also where a forked child must fail it
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed() and self._future.done()

    def get_future(self) -> torch.futures.Future:
        return self._future


class CompressedAllGather(AllGather):
    """``regather_ranks``: the ranks of the post-forward group of an int
    ``reshard_after_forward``, where FSDP2 gathers the parameters forward's all-gather
    decoded: sent as they are, so that backward sees forward's values (a lossy codec would
    round them again, on other blocks)."""

    def __init__(
        self, spec: CollectiveSpec, stats: CommStats, timeout, module_name, groups,
        regather_ranks: tuple[int, ...] | None = None,
    ):  # fmt: skip
        self.spec, self.stats, self.timeout, self.module_name = spec, stats, timeout, module_name
        self.groups: OwnGroups = groups
        self.regather_ranks = regather_ranks

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        numel, dtype, n = input_tensor.numel(), input_tensor.dtype, group.size()
        algorithm, codec = _resolve(
            self.spec,
            "all_gather",
            input_tensor,
            group,
            self.groups,
            self.timeout,
            module_name=self.module_name,
        )
        if tuple(dist.get_process_group_ranks(group)) == self.regather_ranks:
            codec = LOSSLESS
        _check_call_dtype("all_gather", algorithm, codec, dtype, self.module_name)
        own = self.groups.for_call(group, algorithm, input_tensor)
        raw = wire_bytes("all_gather", "native", "none", numel, n, dtype)
        wire = call_wire_bytes("all_gather", algorithm, codec, input_tensor, own)
        watch = Stopwatch(self.stats, wire, raw)
        issued = time.monotonic()
        work = all_gather_into_tensor(
            output_tensor,
            input_tensor,
            own,
            codec=codec,
            algorithm=algorithm,
            async_op=True,
            timeout=self.timeout,
        )
        wait_native = partial(
            _wait_native, "all_gather_into_tensor", codec, own, self.timeout, issued
        )
        return _finish(work, watch, async_op, output_tensor, wait_native, own)

    def __repr__(self) -> str:
        return f"CompressedAllGather({self.spec.text!r}, module={self.module_name!r})"


class CompressedReduceScatter(ReduceScatter):
    def __init__(self, spec, stats: CommStats, timeout, module_name, error_feedback, groups):
        self.spec, self.stats, self.timeout, self.module_name = spec, stats, timeout, module_name
        self.error_feedback = error_feedback
        self.groups: OwnGroups = groups
        self.residual: torch.Tensor | None = None
        #: per parameter, whether it has a gradient in the next call's input; in the residual's
        self._reduced: tuple[bool, ...] | None = None
        self._residual_of: tuple[bool, ...] | None = None
        #: per parameter, the elements its gradient takes in the input (error feedback)
        self.numels: list[int] = []

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        numel, dtype, n = input_tensor.numel(), input_tensor.dtype, group.size()
        op = _sum_or_average(op, self.module_name)
        feedback = self.error_feedback
        algorithm, codec = _resolve(
            self.spec,
            "reduce_scatter",
            input_tensor,
            group,
            self.groups,
            self.timeout,
            feedback,
            op,
            module_name=self.module_name,
        )
        _check_call_dtype("reduce_scatter", algorithm, codec, dtype, self.module_name)
        own = self.groups.for_call(group, algorithm, input_tensor)
        raw = wire_bytes("reduce_scatter", "native", "none", numel, n, dtype)
        wire = call_wire_bytes("reduce_scatter", algorithm, codec, input_tensor, own)
        watch = Stopwatch(self.stats, wire, raw)
        issued = time.monotonic()
        work = reduce_scatter_tensor(
            output_tensor,
            input_tensor,
            op,
            own,
            codec=codec,
            algorithm=algorithm,
            async_op=True,
            timeout=self.timeout,
            residual=self._residual(input_tensor),
        )
        wait_native = partial(
            _wait_native, "reduce_scatter_tensor", codec, own, self.timeout, issued
        )
        return _finish(work, watch, async_op, output_tensor, wait_native, own)

    def discard_step(self) -> None:
        """FSDP2 discarded the gradients in flight (``reset_iter_state()`` after an
        exception; under gradient accumulation the whole microbatch sequence): a residual
        fed by them holds the rounding error of gradients no optimizer sees, and which
        backwards of the sequence fed it cannot be told here: restart from zero."""
        self.residual, self._residual_of = None, None

    def note_reduced(self, has_gradient: tuple[bool, ...]) -> None:
        """Which of the module's parameters the next call carries (FSDP2 reduce-scatters
        only those with a gradient)."""
        self._reduced = has_gradient

    def residual_state(self) -> dict:
        """The residual (on the CPU) and which parameters' gradients it came from."""
        residual = None if self.residual is None else self.residual.to("cpu", copy=True)
        residual_of = None if self._residual_of is None else list(self._residual_of)
        return {"residual": residual, "parameters_with_gradients": residual_of}

    def checked_residual_state(self, saved: object, argument: str):
        """``(residual, residual_of)`` of a :meth:`residual_state` of this module, copied."""
        keys = ("residual", "parameters_with_gradients")
        if not isinstance(saved, dict) or sorted(saved) != sorted(keys):
            raise ValueError(f"{argument} must be a dict of {list(keys)}, got {saved!r}")
        residual, residual_of = saved["residual"], saved["parameters_with_gradients"]
        if residual is None and residual_of is None:  # saved before the first step
            return None, None
        if not isinstance(residual, torch.Tensor) or residual.dtype != torch.float32:
            raise TypeError(f"{argument}['residual'] must be a float32 tensor, got {residual!r}")
        count = len(self.numels)
        if (
            not isinstance(residual_of, list)
            or len(residual_of) != count
            or not all(isinstance(flag, bool) for flag in residual_of)
        ):
            raise ValueError(
                f"{argument}['parameters_with_gradients'] must be {count} bools, one per "
                f"parameter of module {self.module_name!r}, got {residual_of!r}"
            )
        numel = sum(n for n, has in zip(self.numels, residual_of, strict=True) if has)
        if residual.shape != (numel,):
            raise ValueError(
                f"{argument}['residual'] has shape {tuple(residual.shape)}, and module "
                f"{self.module_name!r} reduce-scatters ({numel},) for those parameters: a "
                "state of another model or sharding"
            )
        return residual.clone(), tuple(residual_of)

    def restore_residual(self, residual, residual_of) -> None:
        """What :meth:`checked_residual_state` returned: the next call adds ``residual`` where
        it carries the same parameters."""
        self.residual, self._residual_of = residual, residual_of

    def _residual(self, input_tensor: torch.Tensor) -> torch.Tensor | None:
        """The residual of the same parameters' gradients, or zeros: another set of them
        (one unused this step) lays the input out differently, even at the same size."""
        if not self.error_feedback:
            return None
        stale = self.residual is None or self.residual.shape != input_tensor.shape
        if stale or self._residual_of != self._reduced:
            self.residual = torch.zeros(
                input_tensor.shape, dtype=torch.float32, device=input_tensor.device
            )
            self._residual_of = self._reduced
        if self.residual.device != input_tensor.device:  # loaded from a state_dict
            self.residual = self.residual.to(input_tensor.device)
        return self.residual

    def __repr__(self) -> str:
        return f"CompressedReduceScatter({self.spec.text!r}, module={self.module_name!r})"


def _check_call_dtype(op: str, algorithm: str, codec, dtype: torch.dtype, module_name) -> None:
    """The dtype FSDP2 hands a call must be one ``codec`` encodes (and, reduced, fp32 holds):
    ``compress`` checked the dtypes of then, which a later cast (``model.double()``) changes."""
    if algorithm == NATIVE:
        return
    argument = f"module {module_name!r} {op.replace('_', '-')} dtype"
    if op == "all_gather" and dtype == torch.uint8 and not codec.lossless:
        raise TypeError(
            f"{argument}: parameters of several dtypes are all-gathered as raw bytes "
            f"(uint8), which codec {codec.name!r} cannot encode; give them one dtype "
            "(MixedPrecisionPolicy) or use all_gather='none'"
        )
    if op == "reduce_scatter":
        check_reduction_dtype(dtype, argument)  # first: it names the way out
    codec.check_dtype(dtype, argument)


def _sum_or_average(op, module_name: str):
    """FSDP2 passes SUM, AVG, or PREMUL_SUM(1/factor) for a custom gradient divide factor."""
    kind = op_kind(op)
    if kind in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        return kind
    raise ValueError(
        f"module {module_name!r}: FSDP2 asked for {_op_name(op)} (set_gradient_divide_factor "
        "with a factor other than the world size); commpress reduces with SUM or AVG: call "
        "module.set_force_sum_reduction_for_comms(True) so that FSDP divides before and after"
    )


def _op_name(op) -> str:
    """``PREMUL_SUM(factor 0.333)``: the op FSDP2 makes is a ``ReduceOp`` whose repr is an
    address."""
    kind = getattr(op, "op", op)
    name = getattr(kind, "name", str(kind))
    factor = getattr(op, "factor", None)
    return name if factor is None else f"{name}(factor {factor:.3g})"
