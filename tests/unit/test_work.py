"""Handles of compressed collectives (``commpress.collectives.work``) without a GPU."""

from __future__ import annotations

import concurrent.futures
import threading
from types import SimpleNamespace

import pytest
import torch

from commpress.collectives.work import CollectiveWork, launch


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


def test_a_synchronous_cpu_collective_runs_on_the_calling_thread():
    ran_on = []
    assert launch(lambda: ran_on.append(threading.current_thread()), async_op=False) is None
    assert ran_on == [threading.current_thread()]


def test_an_asynchronous_collective_runs_on_the_communication_thread():
    ran_on = []
    launch(lambda: ran_on.append(threading.current_thread()), async_op=True).wait()
    assert ran_on[0] is not threading.current_thread()
    assert ran_on[0].name.startswith("commpress")


def test_a_synchronous_collective_issued_behind_a_queued_one_runs_after_it():
    release, order = threading.Event(), []

    def first():
        release.wait(10)
        order.append("first")

    queued = launch(first, async_op=True)
    threading.Timer(0.2, release.set).start()
    launch(lambda: order.append("second"), async_op=False)
    queued.wait()
    assert order == ["first", "second"]


def test_a_collective_queued_while_one_runs_inline_waits_for_it():
    started, release, order = threading.Event(), threading.Event(), []
    queued = []

    def inline():
        started.set()
        queued.append(launch(lambda: order.append("queued"), async_op=True))
        release.wait(10)
        order.append("inline")

    threading.Timer(0.2, release.set).start()
    launch(inline, async_op=False)
    queued[0].wait()
    assert order == ["inline", "queued"]


def test_an_inline_collective_that_raises_leaves_the_lane_free():
    def fails():
        raise RuntimeError("peer gone")

    with pytest.raises(RuntimeError, match="peer gone"):
        launch(fails, async_op=False)
    ran_on = []
    launch(lambda: ran_on.append(threading.current_thread()), async_op=False)
    assert ran_on == [threading.current_thread()]
