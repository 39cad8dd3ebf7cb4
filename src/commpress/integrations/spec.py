"""``"CODEC[:options][@ALGORITHM]"``: what an integration compresses with, and how."""

from __future__ import annotations

from dataclasses import dataclass

from commpress.codecs import Codec, get_codec
from commpress.codecs.base import CodecBase
from commpress.collectives import auto
from commpress.collectives.checks import check_algorithm, check_same_result_on_every_rank
from commpress.sim import tuner
from commpress.spec_options import split_algorithm, split_spec


@dataclass(frozen=True)
class CollectiveSpec:
    codec: Codec | str  # a codec, or an ``auto[:max_rel_err=E]`` spec resolved per call
    algorithm: str  # may be ``auto``: resolved per call
    text: str

    @property
    def tuned(self) -> bool:
        return self.algorithm == auto.AUTO or tuner.is_auto(self.codec)

    def resolve(
        self, op: str, tensor, group, error_feedback=False, reduce_op=None, timeout=None
    ) -> tuple[str, Codec]:
        """``(algorithm, codec)`` of one call on ``tensor`` (the rank's input); a
        reduction's ``reduce_op`` is agreed on with the choice, within ``timeout``."""
        algorithm, codec = auto.resolve(
            op, tensor, group, self.codec, self.algorithm, error_feedback,
            reduce_op=reduce_op, timeout=timeout, argument="dtype",
        )  # fmt: skip
        return algorithm, get_codec(codec)

    @classmethod
    def parse(
        cls, spec, algorithms: tuple[str, ...], argument: str, *, gathers: bool, tunable=False
    ) -> CollectiveSpec:
        """``"int8"`` -> int8 over the ring; ``"int4:block=128@alltoall"``; ``"none"``.

        ``gathers``: the collective ends with an all-gather (all-gather, all-reduce), whose
        result must be the same bits on every rank. ``tunable``: ``"auto"`` (codec and
        algorithm chosen per call, error budget :data:`~commpress.sim.tuner.
        DEFAULT_MAX_REL_ERR`), ``"auto:max_rel_err=1e-3"``, ``"int8@auto"`` are accepted.
        A codec object (``cp.get_codec("int8:block=128")``, or one of a program's own) is
        taken as the collectives take one: itself, over the ring (every codec gives every
        rank the same bits there); another algorithm takes a spec string.
        """
        if isinstance(spec, CodecBase):
            return cls(spec, "ring", str(spec))
        if not isinstance(spec, str):
            raise TypeError(
                f"{argument} must be a spec string such as 'int8' or a codec, got {spec!r}"
            )
        codec_text, at, algorithm = split_algorithm(spec)
        _refuse_low_rank(spec, codec_text, argument)
        if at and not algorithm:
            known = (*algorithms, auto.AUTO) if tunable else algorithms
            raise ValueError(f"{argument}={spec!r}: no algorithm after '@'; known: {known}")
        if tuner.is_auto(codec_text) or algorithm == auto.AUTO:
            if not tunable:
                raise ValueError(
                    f"{argument}={spec!r}: 'auto' is for all-gathers and reduce-scatters "
                    "(cp.fsdp.compress), not this collective"
                )
            return cls._tuned(spec, codec_text, algorithm or auto.AUTO, algorithms, argument)
        algorithm = algorithm or "ring"
        try:
            check_algorithm(algorithm, algorithms, tunable)
            codec = get_codec(codec_text)
            if gathers:
                check_same_result_on_every_rank(codec, algorithm)
        except ValueError as error:
            raise ValueError(f"{argument}={spec!r}: {error}") from None
        return cls(codec, algorithm, spec)

    @classmethod
    def _tuned(cls, spec, codec_text, algorithm, algorithms, argument) -> CollectiveSpec:
        try:
            if algorithm != auto.AUTO:
                check_algorithm(algorithm, algorithms, tunable=True)
            if tuner.is_auto(codec_text):
                tuner.budget(codec_text)
                codec = codec_text
            else:
                codec = get_codec(codec_text)
        except ValueError as error:
            raise ValueError(f"{argument}={spec!r}: {error}") from None
        return cls(codec, algorithm, spec)


def _refuse_low_rank(spec: str, codec_text: str, argument: str) -> None:
    """A low-rank spec where a codec's belongs (``cp.ddp.hook("powersgd:rank=4")``) is
    refused with the hook that takes it: "unknown codec 'powersgd'" said nothing of it."""
    from commpress.lowrank.registry import ALGORITHMS  # lowrank imports this layer's ddp

    if split_spec(codec_text)[0] in ALGORITHMS:
        raise ValueError(
            f"{argument}={spec!r} is a low-rank spec, not a codec: DDP takes it as "
            f"cp.lowrank.ddp_hook({codec_text!r}, model=model) (FSDP2 has no low-rank "
            "compression)"
        )
