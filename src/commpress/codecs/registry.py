"""Codec registry and spec strings: ``"int8"``, ``"int8:block=128,stochastic=true"``.

Each codec is a frozen dataclass; its init fields are its options, parsed from the
spec by their annotated type. Validation of values lives in the codec's
``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import typing

from commpress.codecs.base import Codec, CodecBase
from commpress.spec_options import parse_options

_REGISTRY: dict[str, type[CodecBase]] = {}


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
    """Build a codec from a spec string ``NAME[:key=value,...]``; a codec passes through."""
    if isinstance(spec, CodecBase):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"codec spec must be a str or a codec, got {type(spec).__name__}")
    name, _, option_text = spec.strip().partition(":")
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"unknown codec {name!r} in spec {spec!r}; known: {list_codecs()}")
    return cls(**_parse_options(cls, option_text, spec))


def _parse_options(cls: type[CodecBase], text: str, spec: str) -> dict[str, object]:
    hints = typing.get_type_hints(cls)
    types = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}
    return parse_options(text, types, spec, f"codec {cls.name!r}")
