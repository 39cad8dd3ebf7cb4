"""``"powersgd:rank=4,start_iter=10"`` -> an algorithm object."""

from __future__ import annotations

from commpress.lowrank.acpsgd import ACPSGD
from commpress.lowrank.algorithm import LowRankAlgorithm
from commpress.lowrank.powersgd import PowerSGD

ALGORITHMS: dict[str, type[LowRankAlgorithm]] = {"powersgd": PowerSGD, "acpsgd": ACPSGD}
_TYPES = {"rank": int, "start_iter": int, "min_compression_rate": float, "seed": int,
          "orthogonalization": str, "error_feedback": bool, "warm_start": bool}  # fmt: skip


def get_algorithm(spec: str) -> LowRankAlgorithm:
    if not isinstance(spec, str):
        raise TypeError(f"low-rank spec must be a string such as 'powersgd:rank=4', got {spec!r}")
    name, _, options = spec.partition(":")
    if name not in ALGORITHMS:
        raise ValueError(f"unknown low-rank algorithm {name!r}; known: {sorted(ALGORITHMS)}")
    kwargs = {}
    for item in filter(None, options.split(",")):
        key, equals, value = item.partition("=")
        if not equals or key not in _TYPES:
            raise ValueError(f"bad option {item!r} in {spec!r}; options: {sorted(_TYPES)}")
        if _TYPES[key] is bool:
            if value not in ("true", "false"):
                raise ValueError(f"{key} in {spec!r} must be true or false, got {value!r}")
            kwargs[key] = value == "true"
        else:
            try:
                kwargs[key] = _TYPES[key](value)
            except ValueError:
                raise ValueError(f"{key} in {spec!r} must be {_TYPES[key].__name__}") from None
    return ALGORITHMS[name](**kwargs)
