"""Fused fast paths: one plain-torch reference function, compiled once on demand.

A :class:`Kernel` wraps a reference function written in plain torch ops. Its fused
path is that same function through ``torch.compile(dynamic=True)``: sizes are
symbolic, so new tensor sizes do not recompile. The reference is the
specification, and the tests check that both paths agree bit for bit.

If compilation is unavailable (no C++ compiler, an unsupported platform), the
first failure emits one ``RuntimeWarning`` and every kernel falls back to its
reference path for the rest of the process.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from commpress import _torch_private

#: Graphs per kernel: input dtype x output dtype x stochastic or not x size-1 specializations.
#: torch's default of 8 per function is too few for that product.
RECOMPILE_LIMIT = 64

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
    """A reference function plus its lazily compiled twin."""

    def __init__(self, reference: Callable[..., Any]):
        self.reference = reference
        self._compiled: Callable[..., Any] | None = None
        functools.update_wrapper(self, reference)

    def __call__(self, *args: Any, fused: bool = True) -> Any:
        if not (fused and _fused_available):
            return self.reference(*args)
        if self._compiled is None:
            self._compiled = torch.compile(self.reference, dynamic=True, fullgraph=True)
        try:
            with _torch_private.dynamo_config().patch(recompile_limit=RECOMPILE_LIMIT):
                return self._compiled(*args)
        except Exception as error:  # compilation failures surface at the first call
            _disable_fused(error)
            return self.reference(*args)


def kernel(reference: Callable[..., Any]) -> Kernel:
    """Decorator form of :class:`Kernel`."""
    return Kernel(reference)
