"""Seeds made from names: a stream of random numbers that every rank draws alike, and that no
other stream shares."""

from __future__ import annotations

import hashlib


def seed_of(*parts: object) -> int:
    """A 63-bit seed for ``parts`` (their text joined by ``/``): a hash, so that no two tuples
    collide the way sums would (seed 1 of rank 0 against seed 0 of rank 1), and the same in
    every process (no ``hash()``, which strings salt per process)."""
    text = "/".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1
