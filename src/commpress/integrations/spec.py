"""``"CODEC[:options][@ALGORITHM]"``: what an integration compresses with, and how."""

from __future__ import annotations

from dataclasses import dataclass

from commpress.codecs import Codec, get_codec
from commpress.collectives.checks import check_algorithm, check_same_result_on_every_rank


@dataclass(frozen=True)
class CollectiveSpec:
    codec: Codec
    algorithm: str
    text: str

    @classmethod
    def parse(
        cls, spec, algorithms: tuple[str, ...], argument: str, *, gathers: bool
    ) -> CollectiveSpec:
        """``"int8"`` -> int8 over the ring; ``"int4:block=128@alltoall"``; ``"none"``.

        ``gathers``: the collective ends with an all-gather (all-gather, all-reduce), whose
        result must be the same bits on every rank.
        """
        if not isinstance(spec, str):
            raise TypeError(f"{argument} must be a spec string such as 'int8', got {spec!r}")
        codec_text, _, algorithm = spec.partition("@")
        algorithm = algorithm or "ring"
        try:
            check_algorithm(algorithm, algorithms)
            codec = get_codec(codec_text)
            if gathers:
                check_same_result_on_every_rank(codec, algorithm)
        except ValueError as error:
            raise ValueError(f"{argument}={spec!r}: {error}") from None
        return cls(codec, algorithm, spec)
