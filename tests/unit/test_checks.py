"""The argument checks the collectives share, on tensors alone."""

from __future__ import annotations

import pytest
import torch

from commpress.collectives.checks import check_no_shared_elements, elements_may_overlap

BASE = torch.zeros(64)


@pytest.mark.parametrize(
    "tensor",
    [
        BASE.view(8, 8),
        BASE.view(8, 8).t(),
        BASE[::2],
        BASE.view(8, 8)[:, ::3],
        BASE.view(4, 4, 4).permute(2, 0, 1),
        BASE[:0],
        BASE.as_strided((3, 1), (1, 0)),  # a dimension of one element may have any stride
        BASE[5],
    ],
    ids=["contiguous", "transposed", "every-other", "columns", "permuted", "empty", "unit", "0-d"],
)
def test_layouts_torch_makes_without_overlap_are_taken(tensor):
    assert not elements_may_overlap(tensor)
    check_no_shared_elements(tensor, "out")


@pytest.mark.parametrize(
    "tensor",
    [
        torch.zeros(1).expand(8),
        BASE.as_strided((2, 2), (1, 1)),  # [[0, 1], [1, 2]]: element 1 twice
        BASE.as_strided((3, 4), (2, 1)),  # rows of 4 two apart
        BASE.as_strided((2, 2, 2), (4, 1, 3)),
    ],
    ids=["expanded", "diagonal-rows", "rows-overlapping", "three-dims"],
)
def test_layouts_whose_elements_overlap_are_refused_naming_the_argument(tensor):
    """An all-gather into ``as_strided((2, 2), (1, 1))`` wrote [[0, 2], [2, 3]] for
    [[0, 1], [2, 3]] without an error: only a stride of 0 was refused."""
    assert elements_may_overlap(tensor)
    with pytest.raises(ValueError, match="out has elements that share memory"):
        check_no_shared_elements(tensor, "out")
