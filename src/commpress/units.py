"""Link rates and delays as people write them (``"1gbit"``, ``"100mbit"``): SI units, as tc's;
durations given as seconds; element types as nccl-tests names them (``"float"``)."""

from __future__ import annotations

import re
import threading
from decimal import Decimal

#: The longest wait ``threading`` takes (about 292 years); a ``timedelta`` holds it too.
MAX_SECONDS = threading.TIMEOUT_MAX

#: nccl-tests' names of the element types ``commpress bench`` measures (its ``type`` column).
DTYPES = {"float": "float32", "bfloat16": "bfloat16", "half": "float16"}
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_QUANTITY = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*")


def _number_and_unit(text, units: dict, what: str) -> tuple[str, str]:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a string such as {next(iter(units))!r}, got {text!r}")
    match = _QUANTITY.fullmatch(text.lower())
    if not match or match.group(2) not in units:
        raise ValueError(
            f"{what} {text!r} is not understood; use a number and one of {list(units)}"
        )
    return match.group(1), match.group(2)


def parse_quantity(text, units: dict, what: str) -> float:
    """``text`` such as ``"2.5ms"`` in the base unit of ``units``; ``what`` names it."""
    number, unit = _number_and_unit(text, units, what)
    return float(number) * units[unit]


def parse_rate_bits(text, what: str = "link rate") -> int:
    """``"1gbit"`` -> 1_000_000_000 bits per second, exactly (``"2.01gbit"`` is
    2_010_000_000, not the float product's 2_009_999_999); a rate that is not a whole
    number of bits per second is refused."""
    number, unit = _number_and_unit(text, RATE_UNITS, what)
    bits = Decimal(number) * RATE_UNITS[unit]
    if bits <= 0:
        raise ValueError(f"{what} {text!r} must be positive")
    if bits != bits.to_integral_value():
        raise ValueError(f"{what} {text!r} is not a whole number of bits per second")
    return int(bits)


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun`` as a person writes them: ``1 host``, ``2 hosts``
    (``plural``: where adding an s will not do, ``processes``)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def check_seconds(value, what: str = "timeout") -> None:
    """``value`` is a positive, finite number of seconds (not a bool, NaN or infinity, which
    would make a deadline that never comes); ``what`` names the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    if not 0 < value <= MAX_SECONDS:  # also NaN and infinity
        raise ValueError(f"{what} must be a positive, finite number of seconds, got {value!r}")


def torch_dtype(name: str):
    """The torch dtype that the element type ``name`` (one of :data:`DTYPES`) stands for."""
    import torch  # here: the cluster commands use this module and must not wait for torch

    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {name!r}")
    return getattr(torch, DTYPES[name])


def check_racks(racks, hosts: int) -> int:
    """``racks`` is an int of at least 1 that divides ``hosts`` (every rack holds as many)."""
    if isinstance(racks, bool) or not isinstance(racks, int):
        raise TypeError(f"racks must be an int, got {type(racks).__name__}")
    if racks < 1:
        raise ValueError(f"racks must be at least 1, got {racks}")
    if hosts % racks:
        raise ValueError(
            f"racks must divide hosts (every rack holds as many hosts): "
            f"racks={racks}, hosts={hosts}"
        )
    return racks
