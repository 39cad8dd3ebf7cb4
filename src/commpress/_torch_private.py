"""Every private PyTorch API commpress (and its tests) uses, in one place.

torch may rename or drop any of these in any release. Each is reached through a
function here that raises :class:`PrivateAPIMissing` (a ``RuntimeError``) naming the
API and the installed torch version, so that a feature never stops working silently;
``tests/unit/test_torch_private.py`` checks that every entry of :data:`PRIVATE_APIS`
exists in the installed torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

FSDP_API_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_api"
FSDP_COLLECTIVES_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_collectives"


class PrivateAPIMissing(RuntimeError):
    """A private torch API commpress relies on is missing from the installed torch."""


def _missing(api: str) -> PrivateAPIMissing:
    return PrivateAPIMissing(
        f"commpress relies on the private PyTorch API {api}, which torch {torch.__version__} "
        "does not have (renamed or removed); use a torch version commpress supports or "
        "update commpress._torch_private"
    )


def _attribute(owner: Any, name: str, api: str) -> Any:
    try:
        return getattr(owner, name)
    except AttributeError:
        raise _missing(api) from None


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise _missing(name) from None


def fsdp_comm_classes() -> tuple[type, type]:
    """FSDP2's base classes of custom collectives: ``(AllGather, ReduceScatter)``."""
    api = _module(FSDP_API_MODULE)
    return (
        _attribute(api, "AllGather", f"{FSDP_API_MODULE}.AllGather"),
        _attribute(api, "ReduceScatter", f"{FSDP_API_MODULE}.ReduceScatter"),
    )


def fsdp_default_comm_classes() -> tuple[type, type]:
    """FSDP2's own collectives, ``(DefaultAllGather, DefaultReduceScatter)``: what a module
    calls until ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` (or FSDP2's
    ``set_symm_mem_for_comm``, ``set_allocate_memory_from_process_group_for_comm``) replace
    them."""
    collectives = _module(FSDP_COLLECTIVES_MODULE)
    return (
        _attribute(collectives, "DefaultAllGather", f"{FSDP_COLLECTIVES_MODULE}.DefaultAllGather"),
        _attribute(
            collectives, "DefaultReduceScatter", f"{FSDP_COLLECTIVES_MODULE}.DefaultReduceScatter"
        ),
    )


def replaced_collective(module: torch.nn.Module, which: str) -> object | None:
    """The ``which`` (``"all_gather"`` / ``"reduce_scatter"``) collective set on ``module``
    in place of FSDP2's default (``FSDPParamGroup._all_gather_comm`` /
    ``_reduce_scatter_comm``), or None where its parameter groups use the default."""
    default_all_gather, default_reduce_scatter = fsdp_default_comm_classes()
    default = default_all_gather if which == "all_gather" else default_reduce_scatter
    name = f"_{which}_comm"
    for group in _state_param_groups(module):
        comm = _attribute(group, name, f"FSDPParamGroup.{name}")
        if type(comm) is not default:
            return comm
    return None


def compiled_original(module: torch.nn.Module) -> torch.nn.Module | None:
    """The module ``torch.compile`` wrapped (``OptimizedModule._orig_mod``), or None where
    ``module`` is no such wrapper. A module without an ``_orig_mod`` is none without asking
    the private API (a plain model keeps working on a torch that renamed it), and dynamo is
    not imported for the question (a wrapper exists only once it has been)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None or not hasattr(module, "_orig_mod"):
        return None
    wrapper = _attribute(eval_frame, "OptimizedModule", "torch._dynamo.eval_frame.OptimizedModule")
    if not isinstance(module, wrapper):
        return None
    return _attribute(module, "_orig_mod", "OptimizedModule._orig_mod")


def _compiled_original_attribute() -> object:
    return compiled_original(torch.compile(torch.nn.Linear(1, 1)))


def recompile_limit_error() -> type[Exception]:
    """``torch._dynamo.exc.FailOnRecompileLimitHit``: what a ``fullgraph`` function raises once
    it has as many graphs as dynamo allows one code object."""
    exc = _module("torch._dynamo.exc")
    return _attribute(exc, "FailOnRecompileLimitHit", "torch._dynamo.exc.FailOnRecompileLimitHit")


def dynamo_counters() -> Any:
    """``torch._dynamo.utils.counters`` (tests count compilations with it)."""
    return _attribute(_module("torch._dynamo.utils"), "counters", "torch._dynamo.utils.counters")


def cuda_sleep(cycles: int) -> None:
    """``torch.cuda._sleep``: keep the current CUDA stream busy (GPU tests of stream order)."""
    _cuda_sleep()(cycles)


@dataclass(frozen=True)
class ParamGroup:
    """What commpress reads of one FSDP2 parameter group (``FSDPParamGroup``)."""

    #: The ``FSDPParam`` objects, for :func:`unsharded_parameters`.
    fsdp_params: list
    #: Each parameter's local shard, in the group's order.
    sharded: list[torch.Tensor]
    #: The group's ``MixedPrecisionPolicy``.
    mp_policy: Any
    #: Every process group FSDP may hand this group's custom collectives: the shard
    #: group, the post-forward shard group, a separate reduce-scatter group.
    process_groups: tuple[dist.ProcessGroup, ...]
    #: The post-forward shard group of an int ``reshard_after_forward`` (a smaller group
    #: than the shard group), or None: the group on which FSDP2 all-gathers again the
    #: parameters that forward's all-gather produced (for backward, for recomputation).
    regather_group: dist.ProcessGroup | None = None
    #: False for a group replicated without sharding (a mesh without a shard dimension:
    #: ``fully_shard``'s replicate-only ``dp_mesh_dims``), whose gradients FSDP2 all-reduces
    #: with torch's all-reduce and which it never all-gathers nor reduce-scatters.
    sharded_by_fsdp: bool = True


def fsdp_param_groups(module: torch.nn.Module) -> list[ParamGroup]:
    """The parameter groups of an ``FSDPModule`` (``_get_fsdp_state()._fsdp_param_groups``)."""
    return [_param_group(group) for group in _state_param_groups(module)]


def fsdp_state(module: torch.nn.Module) -> object:
    """The FSDP state of an ``FSDPModule`` (``_get_fsdp_state()``): one object for all the
    modules of one ``fully_shard([m1, m2])`` call, which share its parameter groups and
    collectives."""
    return _attribute(module, "_get_fsdp_state", "FSDPModule._get_fsdp_state")()


def _state_param_groups(module: torch.nn.Module) -> list:
    """The ``FSDPParamGroup`` objects of an ``FSDPModule``: the list ``_fsdp_param_groups``
    (torch 2.13), or the one group or None ``_fsdp_param_group`` of earlier releases (torch
    2.11, seen on a GPU machine: ``benchmarks/gpu_2026-11-27/README.md``)."""
    state = _attribute(module, "_get_fsdp_state", "FSDPModule._get_fsdp_state")()
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    api = "FSDPState._fsdp_param_groups (before torch 2.13: _fsdp_param_group)"
    group = _attribute(state, "_fsdp_param_group", api)
    return [] if group is None else [group]


def _param_group(group: Any) -> ParamGroup:
    fsdp_params = _attribute(group, "fsdp_params", "FSDPParamGroup.fsdp_params")
    sharded = [_attribute(p, "sharded_param", "FSDPParam.sharded_param") for p in fsdp_params]
    meshes = [
        _attribute(group, "mesh_info", "FSDPParamGroup.mesh_info"),
        _attribute(group, "post_forward_mesh_info", "FSDPParamGroup.post_forward_mesh_info"),
    ]
    if _replicated_only(meshes[0]):
        return ParamGroup(
            fsdp_params=list(fsdp_params),
            sharded=sharded,
            mp_policy=_attribute(group, "mp_policy", "FSDPParamGroup.mp_policy"),
            process_groups=(),
            sharded_by_fsdp=False,
        )
    process_groups = []
    for mesh in meshes:
        if mesh is None:  # no resharding to a smaller mesh after forward
            continue
        process_groups.append(
            _attribute(mesh, "shard_process_group", "FSDPMeshInfo.shard_process_group")
        )
        separate = getattr(mesh, "reduce_scatter_process_group", None)  # optional by design
        if separate is not None:
            process_groups.append(separate)
    shard_mesh, post_forward_mesh = meshes
    regather = None
    if post_forward_mesh is not None and post_forward_mesh is not shard_mesh:
        regather = post_forward_mesh.shard_process_group
    return ParamGroup(
        fsdp_params=list(fsdp_params),
        sharded=sharded,
        mp_policy=_attribute(group, "mp_policy", "FSDPParamGroup.mp_policy"),
        process_groups=tuple(process_groups),
        regather_group=regather,
    )


def _replicated_only(mesh_info: Any) -> bool:
    """A ``DDPMeshInfo`` alone (a replicate dimension, no shard dimension): a mesh of
    ``fully_shard(..., dp_mesh_dims=DataParallelMeshDims(replicate=...))``."""
    return not hasattr(mesh_info, "shard_process_group") and hasattr(
        mesh_info, "replicate_process_group"
    )


def wrap_fsdp_collectives(module: torch.nn.Module, which: str, wrap: Callable) -> None:
    """Replace each parameter group's installed custom collective ``c`` by ``wrap(c)``
    (``FSDPParamGroup._all_gather_comm`` / ``_reduce_scatter_comm``; the tests' deliberately
    broken collectives)."""
    if which not in ("all_gather", "reduce_scatter"):
        raise ValueError(f"which must be 'all_gather' or 'reduce_scatter', got {which!r}")
    for group in _state_param_groups(module):
        name = f"_{which}_comm"
        setattr(group, name, wrap(_attribute(group, name, f"FSDPParamGroup.{name}")))


def before_post_backward(module: torch.nn.Module, callback: Callable) -> None:
    """Call ``callback(reduced)`` as each parameter group of ``module`` starts its
    ``post_backward`` (``FSDPParamGroup.post_backward``, replaced on the instance), with, per
    ``FSDPParam``, whether FSDP2 is about to reduce-scatter its gradient: it holds one
    (``unsharded_param.grad`` or ``unsharded_accumulated_grad``), or it has none and FSDP2
    sends zeros for it (``reduce_scatter_unused_params``, from
    ``set_reduce_scatter_unused_params``; absent from torch releases without it)."""
    for group in _state_param_groups(module):
        original = _attribute(group, "post_backward", "FSDPParamGroup.post_backward")
        fsdp_params = _attribute(group, "fsdp_params", "FSDPParamGroup.fsdp_params")

        def post_backward(
            *args, _original=original, _group=group, _fsdp_params=fsdp_params, **kwargs
        ):
            zeros_for_unused = getattr(_group, "reduce_scatter_unused_params", False)
            callback(tuple(_reduce_scattered(p, zeros_for_unused) for p in _fsdp_params))
            return _original(*args, **kwargs)

        group.post_backward = post_backward


def after_reset_iter_state(module: torch.nn.Module, callback: Callable[[], None]) -> None:
    """Call ``callback()`` after each parameter group of ``module`` is reset by the root's
    ``reset_iter_state()`` (``FSDPParamGroup._reset_iter_state``, replaced on the
    instance), which discards the gradients of a step that an exception aborted."""
    for group in _state_param_groups(module):
        original = _attribute(group, "_reset_iter_state", "FSDPParamGroup._reset_iter_state")

        def reset_iter_state(*args, _original=original, **kwargs):
            result = _original(*args, **kwargs)
            callback()
            return result

        group._reset_iter_state = reset_iter_state


def _reduce_scattered(fsdp_param, zeros_for_unused: bool) -> bool:
    accumulated = _attribute(
        fsdp_param, "unsharded_accumulated_grad", "FSDPParam.unsharded_accumulated_grad"
    )
    unsharded = getattr(fsdp_param, "_unsharded_param", None)  # absent before the first unshard
    if accumulated is not None:
        return True
    if unsharded is None:
        return False
    return unsharded.grad is not None or (zeros_for_unused and unsharded.requires_grad)


def reduce_scatter_numels(module: torch.nn.Module) -> list[int]:
    """Per parameter of ``module``, the elements its gradient takes in FSDP2's reduce-scatter
    input: its padded shard (``FSDPParam.padded_sharded_param_size``) on every rank of the
    shard group (``FSDPMeshInfo.shard_mesh_size``)."""
    numels = []
    for group in _state_param_groups(module):
        mesh = _attribute(group, "mesh_info", "FSDPParamGroup.mesh_info")
        ranks = _attribute(mesh, "shard_mesh_size", "FSDPMeshInfo.shard_mesh_size")
        for fsdp_param in _attribute(group, "fsdp_params", "FSDPParamGroup.fsdp_params"):
            size = _attribute(
                fsdp_param, "padded_sharded_param_size", "FSDPParam.padded_sharded_param_size"
            )
            numels.append(size.numel() * ranks)
    return numels


def unsharded_parameters(group: ParamGroup) -> list[torch.Tensor]:
    """The group's unsharded parameters (``FSDPParam.unsharded_param``; after ``unshard()``)."""
    return [
        _attribute(p, "unsharded_param", "FSDPParam.unsharded_param") for p in group.fsdp_params
    ]


def unshard_asynchronously(module: torch.nn.Module) -> None:
    """Have FSDP2 call ``module``'s own all-gathers with ``async_op=True`` and wait on the
    returned ``Work`` only when it needs the parameters (``FSDPParamGroup.unshard_async_op``,
    which ``FSDPModule._set_unshard_async_op`` sets on a module and all below it)."""
    for group in _state_param_groups(module):
        _attribute(group, "unshard_async_op", "FSDPParamGroup.unshard_async_op")
        group.unshard_async_op = True


def group_timeout(group: dist.ProcessGroup) -> timedelta | None:
    """The timeout ``group`` was made with (``ProcessGroup._get_backend(device).options._timeout``),
    the longest of its backends' where they differ; None where a backend keeps no options
    (MPI, one registered from Python) or the group has none for a device of its config."""
    devices = [pair.split(":", 1)[0] for pair in dist.get_backend_config(group).split(",")]
    get_backend = _attribute(group, "_get_backend", "ProcessGroup._get_backend")
    timeouts = []
    for device in devices:
        try:
            options = getattr(get_backend(torch.device(device)), "options", None)
        except RuntimeError:  # no backend for this device
            return None
        if options is None:
            return None
        timeouts.append(_attribute(options, "_timeout", "Backend.Options._timeout"))
    return max(timeouts)


def process_groups() -> list[dist.ProcessGroup]:
    """Every process group torch holds now (``distributed_c10d._world.pg_map``'s keys)."""
    return list(_pg_map())


def _pg_map() -> object:
    world = _attribute(dist.distributed_c10d, "_world", "distributed_c10d._world")
    return _attribute(world, "pg_map", "distributed_c10d._world.pg_map")


def _get_backend_method() -> object:
    return _attribute(dist.ProcessGroup, "_get_backend", "ProcessGroup._get_backend")


def _options_timeout() -> object:
    from torch._C._distributed_c10d import Backend

    return _attribute(Backend.Options, "_timeout", "Backend.Options._timeout")


def negative_view(x: torch.Tensor) -> torch.Tensor:
    """``torch._neg_view``: ``-x`` as a lazy view of ``x``'s memory (tests of codecs)."""
    return _neg_view()(x)


def _neg_view() -> Callable[[torch.Tensor], torch.Tensor]:
    return _attribute(torch, "_neg_view", "torch._neg_view")


def _cuda_sleep() -> Callable[[int], None]:
    return _attribute(torch.cuda, "_sleep", "torch.cuda._sleep")


def _reset_iter_state_method() -> object:
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    return _attribute(FSDPParamGroup, "_reset_iter_state", "FSDPParamGroup._reset_iter_state")


def _get_fsdp_state_method() -> object:
    from torch.distributed.fsdp import FSDPModule

    return _attribute(FSDPModule, "_get_fsdp_state", "FSDPModule._get_fsdp_state")


#: Every private API above that can be checked without an FSDP model, by name. The
#: per-instance ones (``_fsdp_param_groups``, ``mesh_info``, ...) are checked on a real
#: FSDP2 model in the tests.
PRIVATE_APIS: dict[str, Callable[[], object]] = {
    f"{FSDP_API_MODULE}.AllGather/ReduceScatter": fsdp_comm_classes,
    f"{FSDP_COLLECTIVES_MODULE}.DefaultAllGather/DefaultReduceScatter": fsdp_default_comm_classes,
    "FSDPModule._get_fsdp_state": _get_fsdp_state_method,
    "FSDPParamGroup._reset_iter_state": _reset_iter_state_method,
    "torch._dynamo.eval_frame.OptimizedModule._orig_mod": _compiled_original_attribute,
    "torch._dynamo.exc.FailOnRecompileLimitHit": recompile_limit_error,
    "torch._dynamo.utils.counters": dynamo_counters,
    "torch.cuda._sleep": _cuda_sleep,
    "torch._neg_view": _neg_view,
    "ProcessGroup._get_backend": _get_backend_method,
    "Backend.Options._timeout": _options_timeout,
    "distributed_c10d._world.pg_map": _pg_map,
}
