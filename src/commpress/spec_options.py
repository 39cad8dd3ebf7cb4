"""The ``key=value,...`` options of a spec string (``int8:block=128``,
``powersgd:rank=4``), converted by each option's type."""

from __future__ import annotations

from collections.abc import Mapping

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def split_spec(spec: str) -> tuple[str, str]:
    """``(NAME, options text)`` of ``NAME[:key=value,...]``: the name without the
    whitespace around it, as every option's key and value are read."""
    name, _, options = spec.partition(":")
    return name.strip(), options


def split_algorithm(spec: str) -> tuple[str, str, str]:
    """``(CODEC, "@", ALGORITHM)`` of ``CODEC[:options][@ALGORITHM]`` (``"@"`` and the
    algorithm empty without one): the algorithm without the whitespace around it, as a
    spec's name and options are read."""
    codec, at, algorithm = spec.partition("@")
    return codec, at, algorithm.strip()


def parse_options(text: str, types: Mapping[str, type], spec: str, owner: str) -> dict:
    """``text`` (what follows the ``:``) as keyword arguments; ``types`` maps each known
    option to ``bool``, ``int``, ``float`` or ``str``; ``owner`` names the thing in errors."""
    options: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not raw:
            raise ValueError(f"option {item!r} in spec {spec!r} must look like key=value")
        if key not in types:
            raise ValueError(
                f"unknown option {key!r} for {owner} in spec {spec!r}; "
                f"known options: {list(types) or 'none'}"
            )
        if key in options:
            raise ValueError(f"option {key!r} given twice in spec {spec!r}")
        options[key] = _convert(raw, types[key], key, spec)
    return options


def _convert(raw: str, kind: type, key: str, spec: str) -> object:
    if kind is bool:
        lowered = raw.lower()
        if lowered in _TRUE | _FALSE:
            return lowered in _TRUE
        raise ValueError(f"option {key}={raw!r} in spec {spec!r} must be true or false")
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            article = "an" if kind is int else "a"
            raise ValueError(
                f"option {key}={raw!r} in spec {spec!r} must be {article} {kind.__name__}"
            ) from None
    return raw
