"""Codecs: fixed-size tensor <-> uint8 payload transforms, registered by name.

>>> codec = get_codec("int8:block=128")
>>> payload = codec.encode(x)                 # len(payload) == codec.wire_bytes(x.numel(), x.dtype)
>>> y = codec.decode(payload, x.numel(), x.dtype)
"""

from commpress.codecs import bf16, fp8, fp16, int4, int8, none, zfp  # noqa: F401  (registration)
from commpress.codecs.base import FLOAT_DTYPES, Codec
from commpress.codecs.registry import get_codec, list_codecs, register

__all__ = ["FLOAT_DTYPES", "Codec", "get_codec", "list_codecs", "register"]
