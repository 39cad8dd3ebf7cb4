"""Shared helper of these scripts: how many units in the last place two float32 tensors differ."""

import torch


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of the last place of the larger of the two, elementwise."""
    larger = torch.maximum(a.abs(), b.abs())
    ulp = torch.nextafter(larger, torch.tensor(float("inf"))) - larger
    return ((a - b).abs() / ulp).round()
