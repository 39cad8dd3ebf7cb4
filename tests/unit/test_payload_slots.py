"""The payload slots of a run are kept for the next run of the same schedule, with every
message back in its row, and never keep workspace memory alive that the workspace has
let go."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from commpress.codecs import get_codec
from commpress.collectives.payloads import reduction, slots
from commpress.collectives.work import release_workspace
from commpress.collectives.workspace import workspace
from commpress.schedules import plan

CPU = torch.device("cpu")
NAME = "test.slots"


def _schedule(numel: int):
    (schedule,) = plan("all_gather", "ring", 1, 4, numel, torch.float32, get_codec("int8"))
    return schedule


def _inside(view: torch.Tensor, whole: torch.Tensor) -> bool:
    start, end = whole.data_ptr(), whole.data_ptr() + whole.numel() * whole.element_size()
    return start <= view.data_ptr() and view.data_ptr() + view.numel() <= end


def test_the_same_schedule_reuses_its_slots_with_moved_messages_back_in_their_rows():
    schedule = _schedule(4096)
    first = slots(NAME, schedule, CPU)
    elsewhere = torch.empty_like(first.message(2, 0))
    first.move(2, 0, elsewhere)
    assert first(2, 0).data_ptr() == elsewhere.data_ptr() + first.header

    again = slots(NAME, schedule, CPU)
    assert again is first
    assert _inside(again.message(2, 0), again.rows) and _inside(again(2, 0), again.rows)
    assert again(2, 0).data_ptr() == again.message(2, 0).data_ptr() + again.header


def test_the_slots_of_several_call_shapes_are_kept_side_by_side():
    small, large = _schedule(4096), _schedule(8192)
    slots(NAME, large, CPU)  # the larger first: the smaller takes no new memory
    kept_small = slots(NAME, small, CPU)
    assert slots(NAME, large, CPU) is not kept_small
    assert slots(NAME, small, CPU) is kept_small


def test_slots_never_keep_memory_the_workspace_let_go():
    """A freed or a replaced (grown) buffer drops every slot kept: their views would keep
    the old memory allocated (on a GPU: device memory ``release_workspace`` said it freed)."""
    schedule = _schedule(4096)
    released = weakref.ref(slots(NAME, schedule, CPU))
    release_workspace()
    gc.collect()
    assert released() is None
    remade = slots(NAME, schedule, CPU)
    for chunk in range(4):
        assert _inside(remade(chunk, 0), remade.rows)

    outgrown = weakref.ref(remade)
    del remade
    workspace.take(NAME, 1 << 24, torch.uint8, CPU)  # the buffer grows: a new allocation
    gc.collect()
    assert outgrown() is None


@pytest.mark.parametrize("algorithm", ["ring", "ring-hop", "alltoall"])
def test_a_reduction_in_a_world_of_one_is_its_own_contribution_bit_for_bit(algorithm):
    """Nothing is sent nor encoded: the result is the rank's contribution as it is."""
    contributions = torch.randn(1, 1000, generator=torch.Generator().manual_seed(3))
    (schedule,) = plan("reduce_scatter", algorithm, 0, 1, 1000, torch.float32, get_codec("int4"))
    reduced = reduction(contributions, get_codec("int4"), schedule)
    for step in schedule.steps:
        for send in step.sends:
            reduced.encode_own(send)
    reduced.begin()
    for step in schedule.steps:
        for receive in step.receives:
            reduced.handle(receive)
    assert torch.equal(reduced.result, contributions[0])


def test_the_own_rows_of_the_alltoall_send_blocks_are_zero_whatever_the_workspace_held():
    """The own row of each piece's send block is sent but never encoded: it must not carry
    what the workspace held before (another call's payloads)."""
    codec = get_codec("int8:block=64")
    (schedule,) = plan("reduce_scatter", "alltoall", 1, 3, 3000, torch.float32, codec)
    stale = workspace.take("alltoall.send", 1 << 16, torch.uint8, CPU)
    stale.fill_(0xA5)
    contributions = reduction(torch.randn(3, 1000), codec, schedule)
    assert contributions.sent[0].data_ptr() == stale.data_ptr()  # the stale buffer
    assert all(block[1].eq(0).all() for block in contributions.sent)


@pytest.mark.parametrize("codec", ["int8", "none"])
def test_an_all_to_alls_sums_are_made_in_memory_kept_from_call_to_call(codec):
    """Its result and each piece's decoded payload were fresh tensors every call (a page
    fault per page on first touch): two runs of one schedule now sum in the same memory,
    as the ring's partial sums do."""
    coder = get_codec(codec)
    (schedule,) = plan("reduce_scatter", "alltoall", 0, 2, 8192, torch.float32, coder)
    contributions, peers = torch.randn(2, 4096), torch.randn(4096)  # rank 1's part of chunk 0
    (receive,) = schedule.steps[0].receives
    results = []
    for _ in range(2):
        payloads = reduction(contributions, coder, schedule)
        payloads.receive_buffer(receive).copy_(coder.encode(peers))
        payloads.begin()
        payloads.handle(receive)
        results.append(payloads.result)
    assert results[0].data_ptr() == results[1].data_ptr()
    expected = contributions[0] + coder.decode(coder.encode(peers), 4096, torch.float32)
    torch.testing.assert_close(results[1], expected, rtol=0, atol=0)
