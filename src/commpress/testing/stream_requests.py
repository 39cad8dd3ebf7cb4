"""What the native decodes were asked: past the caches or through them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from commpress.codecs import native


@contextlib.contextmanager
def recorded_stream_requests() -> Iterator[list[int]]:
    """The ``stream`` argument of every native decode inside (on any thread), in call order:
    1 where it asked for non-temporal stores (:func:`commpress.codecs.blockwise.streams`)."""
    asked: list[int] = []
    real = native.kernel

    def recording(name: str):
        kernel = real(name)
        if kernel is None or not name.startswith("decode"):
            return kernel
        return lambda *args: asked.append(args[-1]) or kernel(*args)

    native.kernel = recording
    try:
        yield asked
    finally:
        native.kernel = real
