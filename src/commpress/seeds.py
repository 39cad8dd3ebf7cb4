"""Seeds made from names: a stream of random numbers that every rank draws alike, and that no
other stream shares."""

from __future__ import annotations

import hashlib


def digest(data: bytes) -> int:
    """A 63-bit digest of ``data``, the same in every process (no ``hash()``, which strings
    salt per process); it fits a signed 64-bit integer (a generator's seed, a tensor)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def seed_of(*parts: object) -> int:
    """A 63-bit seed for ``parts`` (their text joined by ``/``): a hash, so that no two tuples
    collide the way sums would (seed 1 of rank 0 against seed 0 of rank 1)."""
    return digest("/".join(map(str, parts)).encode())
