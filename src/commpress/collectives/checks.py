"""Argument checks shared by the collectives: all run before any communication."""

from __future__ import annotations

import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.collectives.failures import GROUP_DESTROYED
from commpress.schedules import NATIVE, REDUCTION_DTYPES, get_algorithm
from commpress.schedules.payloads import MIN_CHUNK_BYTES
from commpress.schedules.registry import (
    ERROR_FEEDBACK_ALGORITHMS,
    every_algorithm,
    same_result_on_every_rank,
)
from commpress.sim import tuner
from commpress.transport import backends
from commpress.units import counted

SUPPORTED_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)
#: What a call given a destroyed process group raises.
DESTROYED = (
    f"group: {GROUP_DESTROYED}, or by commpress, which destroys a gloo group of its own on "
    "which a collective failed once its owner is gone: make one with new_group"
)


def check_group(group, *, member: bool = False) -> None:
    """A process group, None, or (unless ``member``: the caller needs a group it can use,
    and one not destroyed) what ``new_group`` returns on a rank outside the group."""
    if isinstance(group, dist.ProcessGroup) and member and not backends.registered(group):
        raise ValueError(DESTROYED)
    if group is None or isinstance(group, dist.ProcessGroup):
        return
    if type(group) is int and group == dist.GroupMember.NON_GROUP_MEMBER:
        if not member:
            return
        raise ValueError(
            "group: this rank is not a member of the group (new_group returned "
            "NON_GROUP_MEMBER here); call this on the group's ranks only"
        )
    raise TypeError(
        f"group must be a torch.distributed.ProcessGroup or None, got {type(group).__name__}"
    )


def check_flag(value, argument: str) -> None:
    """``value`` is a bool (a string such as ``"no"`` would read as True)."""
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be True or False, got {value!r}")


def outside_group(group: dist.ProcessGroup | None, name: str) -> bool:
    """Whether this rank is not a member of ``group``; then, as torch.distributed's own
    collectives do, the call does nothing, with a warning."""
    check_group(group)
    if group is None:
        return False
    try:
        if dist.get_rank(group) >= 0:
            return False
    except ValueError as error:  # torch's "Group ... is not registered"
        if backends.registered(group):
            raise
        raise ValueError(DESTROYED) from error
    warnings.warn(
        f"commpress.{name} called on global rank {dist.get_rank()}, which is not in the "
        "group: nothing done (as torch.distributed does)",
        stacklevel=3,
    )
    return True


#: The longest timeout taken. gloo adds a transfer's timeout to the system clock in
#: nanoseconds since 1970, which overflows from about 86,000 days on (the call then fails
#: at once with "Timed out waiting ...", or hangs), and Python's waits end far below
#: ``timedelta.max``.
LONGEST_TIMEOUT = timedelta(days=10_000)


def check_timeout(timeout, argument: str = "timeout") -> None:
    if timeout is None:
        return
    if not isinstance(timeout, timedelta):
        raise TypeError(
            f"{argument} must be a datetime.timedelta or None, got {timeout!r}: "
            f"e.g. {argument}=datetime.timedelta(seconds=30)"
        )
    if timeout <= timedelta(0):
        raise ValueError(f"{argument} must be positive, got {timeout}")
    if timeout > LONGEST_TIMEOUT:
        raise ValueError(
            f"{argument} must be at most {LONGEST_TIMEOUT.days} days, got {timeout}: longer "
            "waits reach where gloo's deadline overflows (about 86,000 days)"
        )


def check_algorithm(
    algorithm: str, known: tuple[str, ...], tunable: bool = False, collective: str = ""
) -> None:
    """``algorithm`` must be one of ``known``, those of ``collective`` (named in the
    message); the message lists ``auto`` too where the call is ``tunable`` (the tuner
    chooses for it)."""
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a str such as 'ring', got {algorithm!r}")
    if algorithm not in known:
        if tunable:
            known = (*known, "auto")
        if algorithm == "auto":  # the tuner's: all_reduce has none
            raise ValueError(
                "algorithm 'auto' chooses for all_gather_into_tensor and reduce_scatter_tensor "
                f"only; known here: {known}"
            )
        if algorithm in every_algorithm():  # another op's
            raise ValueError(
                f"algorithm {algorithm!r} does not run {collective or 'this collective'}; "
                f"known: {known}"
            )
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {known}")


def check_codec_has_no_tuner(codec) -> None:
    """``codec="auto..."`` is the tuner's, which chooses for all-gathers and reduce-scatters."""
    if tuner.is_auto(codec):
        raise ValueError(
            f"codec {codec!r}: 'auto' chooses for all_gather_into_tensor and "
            "reduce_scatter_tensor only, not all_reduce: name a codec, such as 'int8'"
        )


def check_device(
    algorithm: str, op: str, tensor: torch.Tensor, group, argument: str = "inp"
) -> None:
    """An algorithm whose transport moves host memory takes CPU tensors, and CUDA tensors
    (their payloads staged through host memory) on a group that moves CPU tensors (its
    set-up and argument check run there); anything else is refused up front, and so are
    CPU tensors on a group of two ranks or more that moves none (NCCL alone) and, for every
    compressed algorithm, tensors on a device no backend of the group moves (meta)."""
    if algorithm == NATIVE:
        return
    check_moved(tensor, group, argument)
    if not get_algorithm(algorithm, op).host_transport:
        return
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"algorithm {algorithm!r} moves CPU or CUDA tensors; {argument} is on {tensor.device}: "
            "use algorithm 'ring' or 'backend'"
        )
    backend = backends.name(group)
    if "nccl" in backend:
        raise ValueError(
            f"algorithm {algorithm!r} sets up and checks each call on its group, with CPU "
            f"tensors, on gloo groups only: {_refused_group(backend, group)}; use a gloo "
            "group for it, e.g. dist.new_group(backend='gloo') (CUDA tensors too: their "
            "payloads are staged through host memory), or algorithm 'ring' or 'backend'"
        )


def _refused_group(backend: str, group) -> str:
    """Why a group that names NCCL is refused a host transport."""
    if backends.moves(group, "cpu") is None:
        return f"a {backend} group cannot move CPU tensors"
    return f"a {backend} group hands CUDA tensors to NCCL, a mix not supported here"


def check_moved(tensor: torch.Tensor, group, argument: str = "inp") -> None:
    """What every compressed algorithm needs of a tensor's device: a backend of ``group``
    that moves it (not meta), and on a group of two ranks or more one that moves CPU
    tensors if it is on the CPU (not NCCL alone)."""
    device_type = tensor.device.type
    if device_type not in ("cpu", "cuda") and backends.moves(group, device_type) is None:
        raise ValueError(
            f"{argument} is on {tensor.device}, and a {backends.name(group)} group moves no "
            f"{device_type} tensors: use CPU or CUDA tensors"
        )
    on_cpu = device_type == "cpu"
    if on_cpu and dist.get_world_size(group) > 1 and backends.moves(group, "cpu") is None:
        raise ValueError(
            f"{argument} is on the CPU, and a {backends.name(group)} group moves no CPU tensors: "
            "use a gloo group for them, e.g. dist.new_group(backend='gloo'), or CUDA tensors"
        )


def check_op(op, algorithm: str) -> dist.ReduceOp.RedOpType | dist.ReduceOp:
    """``op`` as a ``ReduceOp.RedOpType``: torch takes ``ReduceOp.AVG`` and
    ``ReduceOp(ReduceOp.AVG)`` alike, and refuses an int (``True`` would read as AVG).
    ``native`` (torch's own collective) takes ``op`` as given: whichever torch takes."""
    if not isinstance(op, dist.ReduceOp):
        raise TypeError(f"op must be a torch.distributed.ReduceOp, got {op!r}")
    if algorithm == NATIVE:
        return op
    kind = op_kind(op)
    if kind not in SUPPORTED_OPS:
        raise ValueError(
            f"op must be ReduceOp.SUM or ReduceOp.AVG, got {kind} (algorithm='native' "
            "takes torch's other ops)"
        )
    return kind


def op_kind(op: dist.ReduceOp) -> dist.ReduceOp.RedOpType:
    """The kind of a reduce op: ``ReduceOp(ReduceOp.SUM)`` is ``SUM``, and ``SUM`` itself."""
    return op if isinstance(op, dist.ReduceOp.RedOpType) else op.op


def check_pair(out: torch.Tensor, inp: torch.Tensor, *, world_size: int, gather: bool) -> None:
    """``out`` holds ``world_size`` x ``inp`` (gather) or ``inp`` holds ``world_size`` x ``out``;
    either may be strided (the collectives run on contiguous copies)."""
    for name, tensor in (("out", out), ("inp", inp)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() == 0:
            raise ValueError(f"{name} is a 0-dim tensor: give it a dimension ({name}.reshape(1))")
    big, small, big_name = (out, inp, "out") if gather else (inp, out, "inp")
    if big.numel() != small.numel() * world_size:
        raise ValueError(
            f"out has shape {tuple(out.shape)} and inp has shape {tuple(inp.shape)}: "
            f"{big_name} must hold world_size={world_size} x {counted(small.numel(), 'element')}, "
            f"not {big.numel()}"
        )
    if out.dtype != inp.dtype or out.device != inp.device:
        raise ValueError(
            f"out ({out.dtype} on {out.device}) and inp ({inp.dtype} on {inp.device}) "
            "must have the same dtype and device"
        )
    check_dense(out, "out")
    check_dense(inp, "inp")
    check_no_shared_elements(out, "out")


def check_no_shared_elements(tensor: torch.Tensor, argument: str) -> None:
    """An output may be strided, as torch's collectives take it, but no two of its elements
    may be one in memory (a stride of 0, as ``expand()`` makes, or strides whose rows
    overlap, as ``as_strided`` can make): they would be written with different values, and
    the one written last would silently win."""
    if elements_may_overlap(tensor):
        raise ValueError(
            f"{argument} has elements that share memory (a stride of 0, as from expand(), or "
            f"overlapping strides), so it cannot hold the result: give a tensor of its own, "
            f"e.g. {argument}.clone()"
        )


def elements_may_overlap(tensor: torch.Tensor) -> bool:
    """Whether two elements of ``tensor`` may be one in memory: unless each dimension (of
    more than one element), taken from the smallest stride up, steps past everything the
    smaller ones span. A layout that interleaves dimensions without overlap counts as
    overlapping too (no torch operation but ``as_strided`` makes one)."""
    if tensor.numel() == 0:
        return False
    layout = zip(tensor.stride(), tensor.shape, strict=True)
    spanned = 0  # the largest offset the dimensions taken so far reach
    for stride, size in sorted((stride, size) for stride, size in layout if size > 1):
        if stride <= spanned:
            return True
        spanned += stride * (size - 1)
    return False


def check_dense(tensor: torch.Tensor, argument: str) -> None:
    """A sparse tensor is never contiguous: say what it is, not that."""
    if tensor.layout != torch.strided:
        raise TypeError(
            f"{argument} is a {tensor.layout} tensor: commpress's collectives move dense "
            f"tensors only ({argument}.to_dense(), or torch.distributed's own collective)"
        )


def check_reduction_dtype(
    dtype: torch.dtype, argument: str, torch_own: str = "algorithm='native'"
) -> None:
    """Compressed reductions add in fp32, so only dtypes fp32 holds exactly may be summed;
    ``torch_own`` says how the caller asks for torch's own collective instead."""
    if dtype not in REDUCTION_DTYPES:
        raise TypeError(
            f"{argument}={dtype}: commpress reductions accumulate in float32, which cannot "
            f"hold {dtype} exactly; use float32, bfloat16 or float16, or {torch_own}"
        )


def check_same_result_on_every_rank(codec, algorithm: str) -> None:
    """An all-gather must leave every rank with the same bits: ``ring-hop`` re-encodes at
    every hop, which only a codec whose decoded values encode to themselves survives."""
    if not same_result_on_every_rank(codec, algorithm):
        raise ValueError(
            f"ring-hop re-encodes at every hop and {codec} is not idempotent, so ranks would "
            "end with different values; use algorithm 'ring' (encode once) for this codec"
        )


def check_chunk_bytes(chunk_bytes) -> None:
    if (
        isinstance(chunk_bytes, bool)
        or not isinstance(chunk_bytes, int)
        or chunk_bytes < MIN_CHUNK_BYTES
    ):
        raise ValueError(
            f"chunk_bytes must be an int of at least {MIN_CHUNK_BYTES}, got {chunk_bytes!r}"
        )


def check_residual(residual, inp: torch.Tensor, algorithm: str) -> None:
    """Error feedback needs every rounding done on the rank that owns the data."""
    if residual is None:
        return
    if algorithm not in ERROR_FEEDBACK_ALGORITHMS:
        raise ValueError(
            f"residual (error feedback) needs algorithm='alltoall' or 'backend' (the same "
            f"all-to-all), got {algorithm!r}: only there is every rounding done on the rank "
            "that owns the data"
        )
    check_residual_tensor(residual, inp)


def check_residual_tensor(residual, inp: torch.Tensor) -> None:
    """``residual`` (not None) can hold what the encoding of ``inp`` loses."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
    if (
        residual.dtype != torch.float32
        or residual.numel() != inp.numel()
        or residual.device != inp.device
        or not residual.is_contiguous()
    ):
        raise ValueError(
            f"residual must be a contiguous float32 tensor of inp's size ({inp.numel()}) on "
            f"{inp.device}, got {residual.dtype} of {residual.numel()} on {residual.device}"
        )
    if residual.is_inference():
        raise ValueError(
            "residual was made under torch.inference_mode: error feedback is training "
            "state, which the collective updates in place; make it outside inference mode"
        )
