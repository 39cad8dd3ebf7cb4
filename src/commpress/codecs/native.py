"""Native CPU code (``blockquant.c``, the codecs' kernels, and the C sources of other
packages, such as the multicast's receive path): built once per machine with the system C
compiler.

The shared library is cached under ``$XDG_CACHE_HOME/commpress`` (default
``~/.cache/commpress``), keyed by the source, the compiler command (``CC``), the flags
and the CPU, so that a build of another ``CC`` is never loaded instead, and a
``-march=native`` build is never loaded on a different processor. Calls go
through ctypes, which releases the GIL while a kernel runs.

Where no compiler is found or the build fails, :func:`load` (and so :func:`kernel`)
returns None after one ``RuntimeWarning``, and the caller uses its Python path instead
(the codecs: torch.compile).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from commpress.codecs.kernels import warn_once

SOURCE = Path(__file__).with_name("blockquant.c")
# No -ffast-math: the kernels must match the torch reference bit for bit. -x c: a C++
# driver named as CC (g++, c++) would otherwise mangle the names that ctypes looks up.
FLAGS = (
    "-x",
    "c",
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-trapping-math",
    "-std=c11",
    "-shared",
    "-fPIC",
)

_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    """A fork while another thread builds would leave the child's lock held for good; the
    child builds again if it needs to (a build writes a temporary file, then renames it)."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)
_libraries: dict[Path, ctypes.CDLL | None] = {}  # by source; None where the build failed


#: The /proc/cpuinfo fields that decide what ``-march=native`` enables: x86's "flags", ARM's
#: "Features" and the implementer and part of its cores.
_CPU_FIELDS = ("flags", "Features", "CPU implementer", "CPU part")


def _cpu_identity() -> str:
    machine = os.uname().machine
    try:
        with open("/proc/cpuinfo") as info:
            fields = {line.strip() for line in info if line.startswith(_CPU_FIELDS)}
    except OSError:
        return machine
    return "\n".join([machine, *sorted(fields)])


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "commpress"


def _compiler_command() -> list[str]:
    """CC (a program, or a command with arguments such as ``ccache gcc``, as make takes
    it), else cc or gcc."""
    named = os.environ.get("CC", "").strip()
    if named:
        if shutil.which(named):
            return [named]
        try:
            return shlex.split(named)
        except ValueError as error:  # an unclosed quote: the build fails as any other
            raise RuntimeError(f"CC={named!r} cannot be read as a command: {error}") from None
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    return [compiler]


def build(extra_flags: tuple[str, ...] = (), source: Path = SOURCE) -> ctypes.CDLL:
    """Compile (or find in the cache) and load ``source``; ``extra_flags`` go after FLAGS."""
    compiler = _compiler_command()
    flags = FLAGS + extra_flags
    text = source.read_bytes()
    command = " ".join([*compiler, *flags])
    key = hashlib.sha256(text + command.encode() + _cpu_identity().encode())
    target = _cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=target.parent, suffix=".so")
        os.close(handle)
        try:
            subprocess.run(
                [*compiler, *flags, "-o", partial, str(source), "-lm"],
                check=True,
                capture_output=True,
                text=True,
            )
            os.replace(partial, target)  # atomic: concurrent ranks may build at once
        except subprocess.CalledProcessError as error:
            raise RuntimeError(f"{compiler[0]} failed: {error.stderr.strip()[:500]}") from None
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return ctypes.CDLL(str(target))


def load(source: Path = SOURCE, instead: str = "torch.compile kernels") -> ctypes.CDLL | None:
    """``source`` built and loaded once per process; None, after one warning that names
    what is used ``instead``, where it cannot be built."""
    library = _libraries.get(source)
    if library is not None:  # on every encode and decode: no lock once built
        return library
    with _lock:
        if source not in _libraries:
            try:
                _libraries[source] = build(source=source)
            except (OSError, RuntimeError) as error:
                _libraries[source] = None
                warn_once(f"commpress: native {source.stem} unavailable ({error}); using {instead}")
        return _libraries[source]


class Address(int):
    """A raw address, passed where the C side takes a pointer (instead of a tensor, whose
    views cost microseconds each to make): the caller vouches that it points into memory
    of a contiguous CPU tensor it holds."""


def kernel(name: str) -> Callable[..., bool] | None:
    """The C function ``commpress_<name>`` taking tensors, or None where unavailable."""
    library = load()
    return None if library is None else wrap(library, name)


@functools.cache  # built once per (library, name): kernel() sits on every encode and decode
def wrap(library: ctypes.CDLL, name: str) -> Callable[..., bool]:
    """Make ``commpress_<name>`` of ``library`` callable with tensors and numbers.

    Each tensor passes its data pointer (an :class:`Address` itself, None NULL), a float a
    C float, an int a 64-bit int; the C types are fixed by the first call (every call site
    passes the same kinds), so that later calls convert in ctypes' C code. The callable
    returns False when the C side declined the arguments (a negative status: an odd int4
    block); a decode's 1 (it wrote past the caches) is a success as its 0 is.
    """
    function = getattr(library, f"commpress_{name}")
    function.restype = ctypes.c_int
    tensors: tuple[int, ...] = ()  # the positions of the pointer arguments

    def status(*args: torch.Tensor | float | int | None) -> int:
        nonlocal tensors
        if function.argtypes is None:
            tensors = tuple(i for i, arg in enumerate(args) if _c_type(arg) is ctypes.c_void_p)
            function.argtypes = [_c_type(arg) for arg in args]
        values = list(args)
        for i in tensors:
            if isinstance(values[i], torch.Tensor):
                values[i] = _pointer(values[i])
            elif values[i] is not None and not isinstance(values[i], Address):
                raise TypeError(f"argument {i} must be a tensor, an Address or None")
        return function(*values)

    def call(*args: torch.Tensor | float | int | None) -> bool:
        return status(*args) >= 0

    call.status = status  # what the C side returned
    return call


def _c_type(arg: torch.Tensor | float | int | None) -> type:
    if arg is None or isinstance(arg, (torch.Tensor, Address)):
        return ctypes.c_void_p
    return ctypes.c_float if isinstance(arg, float) else ctypes.c_int64


def _pointer(tensor: torch.Tensor) -> int:
    if not (tensor.is_cpu and tensor.is_contiguous()):  # the kernel would read other memory
        raise ValueError("a native kernel takes contiguous CPU tensors only")
    return tensor.data_ptr()
