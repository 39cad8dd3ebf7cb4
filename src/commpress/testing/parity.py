"""Bitwise comparison of tensors."""

from __future__ import annotations

import torch


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, *, context: object = "") -> None:
    """Assert identical dtype, shape and bits, except that any NaN matches any NaN.

    NaN payload bits carry no meaning and differ between equally correct kernels;
    everything else, including the sign of zero and of infinity, must match.
    """
    where = f" ({context})" if context != "" else ""
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}{where}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}{where}"
    nan_actual, nan_expected = torch.isnan(actual), torch.isnan(expected)
    assert torch.equal(nan_actual, nan_expected), f"NaN positions differ{where}"
    keep = ~nan_actual
    bits_actual = actual[keep].contiguous().view(torch.uint8)
    bits_expected = expected[keep].contiguous().view(torch.uint8)
    mismatches = (bits_actual != bits_expected).sum().item()
    assert mismatches == 0, f"{mismatches} differing bytes{where}"
