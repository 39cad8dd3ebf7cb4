"""Command-line value types shared by the benchmarks; each refuses a bad value with an
:class:`InvalidValue` that says why."""

from __future__ import annotations

import argparse
import math
import os
import tempfile

from commpress.cluster.layout import MAX_HOSTS
from commpress.units import DTYPES, check_seconds

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
#: ``--dtype`` values, named as nccl-tests names them -> the name of the torch dtype.


class InvalidValue(argparse.ArgumentTypeError, ValueError):
    """A bad value of an option. argparse shows the reason of an ArgumentTypeError, where it
    replaces a plain ValueError's with 'invalid positive_int value: '0''; a caller that
    parses a list of them catches it as a ValueError."""


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidValue(f"{text!r} is not a whole number") from None


def bounded_int(text: str, least: int, most: int) -> int:
    value = whole_number(text)
    if not least <= value <= most:
        raise InvalidValue(f"{text!r}: must be in [{least}, {most}]")
    return value


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise InvalidValue(f"{text!r}: must be at least 1")
    return value


#: The most local processes a command starts: as many as an emulated cluster's hosts, for
#: which the local ones stand in (each holds a connection to every other, and its memory).
MAX_LOCAL_PROCESSES = MAX_HOSTS


def local_processes(text: str) -> int:
    """``--nprocs``: 1 to :data:`MAX_LOCAL_PROCESSES`."""
    value = positive_int(text)
    if value > MAX_LOCAL_PROCESSES:  # argparse shows an ArgumentTypeError's reason
        raise argparse.ArgumentTypeError(
            f"{value} local processes: at most {MAX_LOCAL_PROCESSES}, an emulated "
            "cluster's most hosts"
        )
    return value


def seconds(text: str) -> float:
    """A positive, finite number of seconds (``--timeout``)."""
    try:
        value = float(text)
        check_seconds(value, "a duration")
    except ValueError as error:  # argparse shows an ArgumentTypeError's reason
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
    return value


def non_negative_int(text: str) -> int:
    value = whole_number(text)
    if value < 0:
        raise InvalidValue(f"{text!r}: must be at least 0")
    return value


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidValue(f"{text!r} is not a number") from None
    if not 0 <= value < 1:  # NaN too
        raise InvalidValue(f"{text!r}: must be in [0, 1)")
    return value


def positive_number(text: str) -> float:
    """A finite number above 0 (``--lr``)."""
    try:
        value = float(text)
    except ValueError:
        raise InvalidValue(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:  # NaN too
        raise InvalidValue(f"{text!r}: must be above 0 and finite")
    return value


def size_factor(text: str) -> int:
    value = whole_number(text)
    if value < 2:
        raise InvalidValue(f"{text!r}: must be at least 2 for the sweep to advance")
    return value


def byte_size(text: str) -> int:
    """``1048576``, ``64K``, ``1M``, ``2G`` (an optional trailing B or iB: every unit is
    binary), at least 1."""
    cleaned = text.strip().upper().removesuffix("B")
    if cleaned[-2:] in {unit + "I" for unit in UNITS}:  # 1MiB as 1M
        cleaned = cleaned[:-1]
    try:
        if cleaned and cleaned[-1] in UNITS:
            number = float(cleaned[:-1]) * UNITS[cleaned[-1]]
            if not math.isfinite(number):  # int() of it raises OverflowError
                raise InvalidValue(f"{text!r}: must be a finite number of bytes")
            if not number.is_integer():  # int() would drop the fraction of a byte
                raise InvalidValue(f"{text!r} is {number:g} bytes: not a whole number of bytes")
            value = int(number)
        else:
            value = int(cleaned)
    except InvalidValue:
        raise
    except ValueError:
        raise InvalidValue(f"{text!r} is not a size: bytes such as 1048576, 64K, 1M") from None
    if value < 1:
        raise InvalidValue(f"{text!r}: must be at least 1 byte")
    return value


def naming(option: str, check, value):
    """``check(value)``, where a ValueError it raises names ``option`` (``--codec: unknown
    codec 'int9' in spec 'int9'; ...``): a command's message then says which of its values
    was wrong."""
    try:
        return check(value)
    except ValueError as error:
        if str(error).startswith(option):
            raise
        raise ValueError(f"{option}: {error}") from None


def named_twice(items: list[str]) -> list[str]:
    """The items that ``items`` names more than once, sorted (a repeated one would only
    repeat a command's rows)."""
    return sorted({item for item in items if items.count(item) > 1})


def same_twice(texts: list[str], meaning) -> str:
    """Where two of ``texts`` mean the same (``meaning(text)``: ``1M`` and ``1048576``,
    ``int8`` and ``int8:block=256``), which would only repeat a command's rows, the two
    named (``'1M' and '1048576'``); else ``""``."""
    first_of = {}
    for text in texts:
        value = meaning(text)
        if value in first_of:
            return f"{first_of[value]!r} and {text!r}"
        first_of[value] = text
    return ""


def comma_list(text: str) -> list[str]:
    """``a,b,c``: at least one item, none twice."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    return _distinct(text, items)


def spec_list(text: str) -> list[str]:
    """Comma-separated specs ``NAME[:key=value,...]``, whose options are comma-separated
    too: a ``key=value`` part (no ``:`` before its ``=``) continues the spec before it, so
    ``int8:block=128,stochastic=true,int4`` is two specs, and so is
    ``auto:max_rel_err=0.01,codecs=int8+zfp:rate=8,int4``. At least one, none twice."""
    specs = []
    for part in (part.strip() for part in text.split(",")):
        if specs and _is_option(part):
            specs[-1] += f",{part}"
        elif part:
            specs.append(part)
    return _distinct(text, specs)


def _is_option(part: str) -> bool:
    """Whether ``part`` is a spec's ``key=value`` option, not a spec ``NAME:key=value``."""
    key, equals, _ = part.partition("=")
    return bool(equals) and ":" not in key


def _distinct(text: str, items: list[str]) -> list[str]:
    if not items:
        raise InvalidValue(f"{text!r}: must name at least one item")
    repeated = named_twice(items)
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r} names {', '.join(repeated)} twice")
    return items


def port(text: str) -> int:
    """A TCP or UDP port, 1 to 65535."""
    value = whole_number(text)
    if not 1 <= value <= 65535:
        raise InvalidValue(f"{text!r}: must be a port in [1, 65535]")
    return value


def dtype_list(text: str) -> list[str]:
    """Comma-separated ``--dtype`` names, each one of :data:`DTYPES`."""
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in DTYPES:  # argparse shows this message, unlike a ValueError's
            choices = ", ".join(map(repr, DTYPES))
            raise argparse.ArgumentTypeError(f"invalid choice: {name!r} (choose from {choices})")
    if named_twice(names):
        raise argparse.ArgumentTypeError(f"a dtype named twice in {text!r}")
    return names


def output_folder(text: str) -> str:
    """A folder the command will write into once it has run: one that exists, or one it
    can make (its nearest existing parent a writable folder), checked now so that a long
    run does not end in an error that loses its results."""
    _check_named(text)
    path = os.path.abspath(text)
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not _can_write_in(existing):
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not a writable folder")
    return text


def output_path(text: str) -> str:
    """A file the command will write once it has run: its folder must exist now, so that a
    long sweep does not end in a ``FileNotFoundError`` that loses its results."""
    _check_named(text)
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: folder {folder} does not exist")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    if not _can_write_in(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: folder {folder} is not writable")
    return text


def _can_write_in(folder: str) -> bool:
    """Whether a file can be made in ``folder``, tried with a nameless one: ``os.access``
    tells root that every folder is writable, ``/proc`` too."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def input_path(text: str) -> str:
    """A file the command reads: named, for an empty path (an unset shell variable) would
    be taken for no file at all, or fail only once the ranks have started; one that is
    there to read, so that the error names the option that gave it."""
    _check_named(text)
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text!r}: no such file")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: not readable")
    return text


def plot_path(text: str) -> str:
    """``--plot``: an :func:`output_path` with matplotlib there to draw it, checked now so
    that a long sweep does not end in an ImportError and exit status 2."""
    path = output_path(text)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: drawing needs matplotlib: pip install 'commpress[plot]'"
        ) from None
    return path


def _check_named(text: str) -> None:
    """An empty path (an unset shell variable) would write nothing, or into the current
    folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: name a file or folder")
