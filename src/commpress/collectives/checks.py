"""Argument checks shared by the collectives: all run before any communication."""

from __future__ import annotations

import torch
import torch.distributed as dist

SUPPORTED_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)


def check_algorithm(algorithm: str, known: tuple[str, ...]) -> None:
    if algorithm not in known:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {known}")


def check_op(op) -> None:
    if op not in SUPPORTED_OPS:
        raise ValueError(f"op must be ReduceOp.SUM or ReduceOp.AVG, got {op}")


def check_pair(out: torch.Tensor, inp: torch.Tensor, *, world_size: int, gather: bool) -> None:
    """``out`` holds ``world_size`` x ``inp`` (gather) or ``inp`` holds ``world_size`` x ``out``."""
    for name, tensor in (("out", out), ("inp", inp)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    big, small, big_name = (out, inp, "out") if gather else (inp, out, "inp")
    if big.numel() != small.numel() * world_size:
        raise ValueError(
            f"out has shape {tuple(out.shape)} and inp has shape {tuple(inp.shape)}: "
            f"{big_name} must hold world_size={world_size} x {small.numel()} elements, "
            f"not {big.numel()}"
        )
    if out.dtype != inp.dtype or out.device != inp.device:
        raise ValueError(
            f"out ({out.dtype} on {out.device}) and inp ({inp.dtype} on {inp.device}) "
            "must have the same dtype and device"
        )
    for name, tensor in (("out", out), ("inp", inp)):
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
