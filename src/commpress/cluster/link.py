"""A host link's properties (rate, delay, MTU): parsing, validation, and how tc shapes them."""

from __future__ import annotations

from dataclasses import dataclass

from commpress.units import RATE_UNITS, parse_quantity, parse_rate_bits

_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
MIN_RATE_BITS = 10**6  # tbf's burst arithmetic is coarse below about 1 Mbit/s
MAX_RATE_BITS = 10**13  # tc takes a burst of at most 4 GiB: one millisecond of 34 Tbit/s
MIN_MTU, MAX_MTU = 576, 65535
#: tc gives netem its delay in 32-bit scheduler ticks of 64 ns: about 274.9 seconds at most.
MAX_DELAY_US = (2**32 - 1) * 64 // 1000
BURST_SECONDS = 1e-3  # the token bucket holds one millisecond of line rate...
MIN_BURST_BYTES = 64 << 10  # ...but never less than this (a few full-size frames)
QUEUE_SECONDS = 0.05  # how long a packet may wait in the shaper before it is dropped


def parse_rate(text: str) -> int:
    """``"1gbit"``, ``"100mbit"``, ``"2.5gbit"`` -> bits per second (SI units, as tc's)."""
    bits = parse_rate_bits(text, "link rate")
    _check_rate(bits, repr(text))
    return bits


def _check_rate(bits: int, shown: str) -> None:
    if bits < MIN_RATE_BITS:
        raise ValueError(f"link rate {shown} is below the minimum of 1mbit")
    if bits > MAX_RATE_BITS:
        raise ValueError(f"link rate {shown} is above the maximum of 10tbit")
    if bits % 8:
        raise ValueError(
            f"link rate {shown} is not a whole number of bytes per second, which tc shapes "
            f"to: give {format_rate(bits - bits % 8)} or {format_rate(bits - bits % 8 + 8)}"
        )


def parse_delay(text: str) -> float:
    """``"5ms"``, ``"200us"`` -> seconds: a whole number of microseconds, as netem is given."""
    seconds = parse_quantity(text, _TIME_UNITS, "delay")
    if seconds <= 0:
        raise ValueError(f"delay {text!r} must be positive")
    if seconds * 1e6 > MAX_DELAY_US:
        raise ValueError(f"delay {text!r} is above netem's maximum of {MAX_DELAY_US}us")
    if abs(seconds * 1e6 - round(seconds * 1e6)) > 1e-6:
        raise ValueError(f"delay {text!r} is not a whole number of microseconds")
    return seconds


def format_rate(bits: int) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits % RATE_UNITS[unit] == 0:
            return f"{bits // RATE_UNITS[unit]}{unit}"
    return f"{bits}bit"


#: Ethernet's MTU, every link's when none is given.
DEFAULT_MTU = 1500


@dataclass(frozen=True)
class Link:
    """One full-duplex host link: ``rate_bits`` per second each way, optional delay."""

    rate_bits: int
    delay_s: float | None = None
    mtu: int = DEFAULT_MTU

    @classmethod
    def parse(cls, rate, delay=None, mtu: int = DEFAULT_MTU) -> Link:
        rate_bits = rate if isinstance(rate, int) and not isinstance(rate, bool) else None
        if rate_bits is None:
            rate_bits = parse_rate(rate)
        else:
            _check_rate(rate_bits, f"{rate} bit/s")
        if isinstance(mtu, bool) or not isinstance(mtu, int):
            raise TypeError(f"mtu must be an int, got {mtu!r}")
        if not MIN_MTU <= mtu <= MAX_MTU:
            raise ValueError(f"mtu must be between {MIN_MTU} and {MAX_MTU}, got {mtu}")
        return cls(rate_bits, None if delay is None else parse_delay(delay), mtu)

    @property
    def bytes_per_second(self) -> float:
        return self.rate_bits / 8

    def seconds_for(self, nbytes: float) -> float:
        """Time the link needs to carry ``nbytes`` at its rate: the ideal for that traffic."""
        return nbytes / self.bytes_per_second

    def tbf_arguments(self) -> list[str]:
        burst = max(MIN_BURST_BYTES, int(self.bytes_per_second * BURST_SECONDS), 2 * self.mtu)
        return [
            "tbf",
            "rate",
            f"{self.rate_bits}bit",
            "burst",
            str(burst),
            "latency",
            f"{int(QUEUE_SECONDS * 1e6)}us",
        ]

    def netem_arguments(self) -> list[str]:
        """The delay as netem takes it (rounded: ``15e-6 * 1e6`` is 14.999999999999998)."""
        return ["netem", "delay", f"{round(self.delay_s * 1e6)}us"]

    def describe(self) -> str:
        text = format_rate(self.rate_bits)
        if self.delay_s is not None:
            text += f", delay {self.delay_s * 1e3:g} ms"
        return f"{text}, mtu {self.mtu}"
