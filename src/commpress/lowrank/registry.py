"""``"powersgd:rank=4,start_iter=10"`` -> an algorithm object."""

from __future__ import annotations

from commpress.codecs import list_codecs
from commpress.lowrank.acpsgd import ACPSGD
from commpress.lowrank.algorithm import LowRankAlgorithm
from commpress.lowrank.powersgd import PowerSGD
from commpress.spec_options import parse_options, split_spec

ALGORITHMS: dict[str, type[LowRankAlgorithm]] = {"powersgd": PowerSGD, "acpsgd": ACPSGD}
_TYPES = {"rank": int, "start_iter": int, "min_compression_rate": float, "seed": int,
          "orthogonalization": str, "error_feedback": bool, "warm_start": bool}  # fmt: skip


def get_algorithm(spec: str) -> LowRankAlgorithm:
    if not isinstance(spec, str):
        raise TypeError(f"low-rank spec must be a string such as 'powersgd:rank=4', got {spec!r}")
    if split_spec(spec.partition("@")[0])[0] in list_codecs():
        raise ValueError(
            f"{spec!r} is a codec spec, not a low-rank one ('powersgd:rank=4', "
            f"'acpsgd:rank=4'): cp.ddp.hook({spec!r}) all-reduces DDP's buckets with it"
        )
    if "@" in spec:
        raise ValueError(
            f"low-rank spec {spec!r} takes no '@ALGORITHM' (a codec spec's): write "
            f"{spec.partition('@')[0]!r} (ddp_hook(..., scheduler=False) is what "
            "'@serial' means to commpress train)"
        )
    name, options = split_spec(spec)
    if name not in ALGORITHMS:
        raise ValueError(f"unknown low-rank algorithm {name!r}; known: {sorted(ALGORITHMS)}")
    parsed = parse_options(options, _TYPES, spec, f"algorithm {name!r}")
    try:
        return ALGORITHMS[name](**parsed)
    except ValueError as error:  # an option out of range: which spec, of several, had it
        raise ValueError(f"low-rank spec {spec!r}: {error}") from None
