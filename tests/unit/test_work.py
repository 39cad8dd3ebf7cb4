"""Handles of compressed collectives (``commpress.collectives.work``) without a GPU."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

import pytest
import torch

from commpress.collectives.work import CollectiveWork


@pytest.mark.parametrize("value", [None, "a CPU tensor"])
def test_a_cuda_future_without_a_tensor_on_the_device_is_refused(value):
    """torch records a CUDA future's completion event only on the devices of its value's
    tensors: without one, a waiter's stream would be ordered after nothing."""
    value = torch.zeros(1) if value == "a CPU tensor" else value
    order = SimpleNamespace(device=torch.device("cuda", 0))
    work = CollectiveWork(concurrent.futures.Future(), order)
    with pytest.raises(ValueError, match=r"value must be a tensor on cuda:0"):
        work.torch_future(value)


def test_a_cpu_future_completes_with_its_value_after_before():
    done, seen = concurrent.futures.Future(), []
    value = torch.arange(3)
    future = CollectiveWork(done).torch_future(value, before=lambda: seen.append("before"))
    assert not future.done()
    done.set_result(None)
    assert seen == ["before"] and future.wait() is value
