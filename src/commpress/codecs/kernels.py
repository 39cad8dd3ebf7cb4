"""Fused fast paths: one plain-torch reference function, compiled once on demand.

A :class:`Kernel` wraps a reference function written in plain torch ops. Its fused
path is that same function through ``torch.compile(dynamic=True)``: sizes are
symbolic, so new tensor sizes do not recompile. The reference is the
specification, and the tests check that both paths agree bit for bit.

Each signature (the dtypes of the arguments, CUDA or not, noise or none) compiles a twin
of the reference with a code object of its own, so that dynamo keeps a cache and a
recompile budget per signature: one shared function would exceed torch's default of 8
graphs per code object (3 input dtypes x noise or none x size-1 specialisations), and
raising that limit around every call instead cost 130-160 us more per call on our CPU
VM (the patch alone 75-79 us; ``benchmarks/gpu_2026-11-27/README.md``). A signature that
still needs more graphs than dynamo allows one function (strides, slices at odd offsets)
gets a fresh twin, with a warning, never the reference.

If compilation is unavailable (no C++ compiler, an unsupported platform), the
first failure emits one ``RuntimeWarning`` and every kernel falls back to its
reference path for the rest of the process.
"""

from __future__ import annotations

import functools
import threading
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from commpress import _torch_private

_fused_available = True
_lock = threading.Lock()


def fused_available() -> bool:
    """False once compilation has failed in this process (and been warned about)."""
    return _fused_available


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """Emit ``message`` as a RuntimeWarning the first time it is given in this process."""
    with _lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _disable_fused(error: BaseException) -> None:
    global _fused_available
    _fused_available = False
    warn_once(
        f"commpress: torch.compile is unavailable ({type(error).__name__}: {error}); "
        "codecs fall back to their (slower) reference path"
    )


class Kernel:
    """A reference function plus its lazily compiled twins, one per signature."""

    def __init__(self, reference: Callable[..., Any]):
        self.reference = reference
        self._compiled: dict[tuple, Callable[..., Any]] = {}
        self._twins = 0  # compiled so far, fresh ones after a recompile limit included
        functools.update_wrapper(self, reference)

    def __call__(self, *args: Any, fused: bool = True) -> Any:
        if not (fused and _fused_available):
            return self.reference(*args)
        key = signature(args)
        try:
            return (self._compiled.get(key) or self._compile(key))(*args)
        except _torch_private.recompile_limit_error():
            pass  # below: a warning made an error (-W error) must not pass for a failed compile
        except Exception as error:  # compilation failures surface at the first call
            return self._fall_back(error, args)
        warn_once(
            f"commpress: kernel {self.reference.__name__} needed more graphs for one "
            "signature than torch._dynamo.config.recompile_limit allows one function; "
            "compiling a fresh twin (slow only if it keeps happening)"
        )
        try:
            return self._compile(key)(*args)
        except Exception as error:
            return self._fall_back(error, args)

    def _fall_back(self, error: BaseException, args: tuple) -> Any:
        _disable_fused(error)
        return self.reference(*args)

    @property
    def twins(self) -> int:
        """How many twins have been compiled (one per signature, plus fresh ones)."""
        return self._twins

    def _compile(self, key: tuple) -> Callable[..., Any]:
        twin = _twin(self.reference, self._twins)
        self._twins += 1
        compiled = self._compiled[key] = torch.compile(twin, dynamic=True, fullgraph=True)
        return compiled


def signature(args: tuple) -> tuple:
    """What splits a kernel's graphs: each tensor argument's dtype and whether it is on a
    GPU; anything else (None: no noise) as itself."""
    return tuple((a.dtype, a.is_cuda) if isinstance(a, torch.Tensor) else a for a in args)


def _twin(function: Callable[..., Any], number: int) -> Callable[..., Any]:
    """``function`` with a code object of its own (dynamo's cache lives on code objects)."""
    name = f"{function.__name__}_signature_{number}"
    names = {"co_name": name}
    if hasattr(function.__code__, "co_qualname"):  # Python 3.11 and later
        names["co_qualname"] = name
    code = function.__code__.replace(**names)
    twin = types.FunctionType(
        code, function.__globals__, name, function.__defaults__, function.__closure__
    )
    twin.__kwdefaults__ = function.__kwdefaults__
    return twin


def kernel(reference: Callable[..., Any]) -> Kernel:
    """Decorator form of :class:`Kernel`."""
    return Kernel(reference)
