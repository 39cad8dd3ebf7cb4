"""Codec registry and spec strings: ``"int8"``, ``"int8:block=128,stochastic=true"``.

Each codec is a frozen dataclass; its init fields are its options, parsed from the
spec by their annotated type. Validation of values lives in the codec's
``__post_init__``.

``get_codec`` returns one shared instance per codec value (``"int8"`` and
``"int8:block=256"`` are one codec): state that a codec keeps on purpose, such as the
stochastic-rounding generators of ``int8``/``int4``, then lives across every collective
that names the spec, instead of restarting (and repeating its noise) on each call.
"""

from __future__ import annotations

import dataclasses
import threading
import typing

from commpress.codecs.base import Codec, CodecBase
from commpress.spec_options import parse_options, split_spec

_REGISTRY: dict[str, type[CodecBase]] = {}
#: The shared instance of each codec value, and of each spec text seen.
_SHARED: dict[Codec, Codec] = {}
_SHARED_BY_TEXT: dict[str, Codec] = {}
_shared_lock = threading.Lock()


def register(cls: type[CodecBase]) -> type[CodecBase]:
    """Class decorator: make ``cls`` reachable by ``get_codec(cls.name)``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a non-empty class attribute 'name'")
    if cls.name in _REGISTRY:
        raise ValueError(f"codec name {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def list_codecs() -> list[str]:
    """Names of all registered codecs, sorted."""
    return sorted(_REGISTRY)


def get_codec(spec: str | Codec) -> Codec:
    """The codec of a spec string ``NAME[:key=value,...]``; a codec passes through.

    Every call with an equivalent spec returns the same instance (see the module doc).
    """
    if isinstance(spec, CodecBase):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"codec spec must be a str or a codec, got {type(spec).__name__}")
    shared = _SHARED_BY_TEXT.get(spec)
    if shared is None:
        built = _build(spec)
        with _shared_lock:
            shared = _SHARED.setdefault(built, built)
            _SHARED_BY_TEXT[spec] = shared
    return shared


def _build(spec: str) -> Codec:
    if "@" in spec:  # the whole CODEC[:options][@ALGORITHM] of an integration's spec
        codec, algorithm = (part.strip() for part in spec.split("@", 1))
        if not algorithm:
            raise ValueError(
                f"codec spec {spec!r} ends in '@': a codec is NAME[:key=value,...]; write "
                f"codec={codec!r} (on the command line --codec {codec})"
            )
        raise ValueError(
            f"codec spec {spec!r} names an algorithm after '@': a codec is "
            f"NAME[:key=value,...]; give the algorithm on its own: codec={codec!r}, "
            f"algorithm={algorithm!r} (on the command line --codec {codec} --algorithm "
            f"{algorithm})"
        )
    name, option_text = split_spec(spec)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"unknown codec {name!r} in spec {spec!r}; known: {list_codecs()}")
    options = _parse_options(cls, option_text, spec)
    try:
        return cls(**options)
    except ValueError as error:  # an option out of range: which spec, of several, had it
        raise ValueError(f"codec spec {spec!r}: {error}") from None


def _parse_options(cls: type[CodecBase], text: str, spec: str) -> dict[str, object]:
    hints = typing.get_type_hints(cls)
    types = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}
    return parse_options(text, types, spec, f"codec {cls.name!r}")
