"""What an integration's collectives did: calls, bytes on the wire, time until done."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class CommStats:
    calls: int = 0
    wire_bytes: int = 0
    raw_bytes: int = 0
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, wire_bytes: int, raw_bytes: int, seconds: float) -> None:
        with self._lock:
            self.calls += 1
            self.wire_bytes += wire_bytes
            self.raw_bytes += raw_bytes
            self.seconds += seconds

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "calls": self.calls,
                "wire_bytes": self.wire_bytes,
                "raw_bytes": self.raw_bytes,
                "seconds": self.seconds,
            }

    def reset(self) -> None:
        with self._lock:
            self.calls, self.wire_bytes, self.raw_bytes, self.seconds = 0, 0, 0, 0.0


class Stopwatch:
    """Started at a call, stopped when its collective completes (maybe on another thread)."""

    def __init__(self, stats: CommStats, wire_bytes: int, raw_bytes: int) -> None:
        self._stats, self._wire, self._raw = stats, wire_bytes, raw_bytes
        self._start = time.perf_counter()

    def stop(self, *_ignored) -> None:
        self._stats.record(self._wire, self._raw, time.perf_counter() - self._start)
