"""Helpers for tests of commpress and of code built on it."""

from commpress.testing.parity import assert_same_bits

__all__ = ["assert_same_bits"]
