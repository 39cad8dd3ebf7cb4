"""The payload slots of a run are kept for the next run of the same schedule, with every
message back in its row, and never outlive the workspace memory they point into."""

from __future__ import annotations

import torch

from commpress.codecs import get_codec
from commpress.collectives.payloads import slots
from commpress.collectives.workspace import release_workspace, workspace
from commpress.schedules import plan

CPU = torch.device("cpu")


def _schedule(numel: int):
    (schedule,) = plan("all_gather", "ring", 1, 4, numel, torch.float32, get_codec("int8"))
    return schedule


def _inside(view: torch.Tensor, whole: torch.Tensor) -> bool:
    start, end = whole.data_ptr(), whole.data_ptr() + whole.numel() * whole.element_size()
    return start <= view.data_ptr() and view.data_ptr() + view.numel() <= end


def test_the_same_schedule_reuses_its_slots_with_moved_messages_back_in_their_rows():
    schedule = _schedule(4096)
    first = slots("test.slots", schedule, CPU)
    elsewhere = torch.empty_like(first.message(2, 0))
    first.move(2, 0, elsewhere)
    assert first(2, 0).data_ptr() == elsewhere.data_ptr() + first.header

    again = slots("test.slots", schedule, CPU)
    assert again is first
    assert _inside(again.message(2, 0), again.rows) and _inside(again(2, 0), again.rows)
    assert again(2, 0).data_ptr() == again.message(2, 0).data_ptr() + again.header


def test_another_schedule_or_freed_workspace_memory_makes_new_slots():
    schedule = _schedule(4096)
    first = slots("test.slots", schedule, CPU)
    assert slots("test.slots", _schedule(8192), CPU) is not first

    kept = slots("test.slots", schedule, CPU)
    epoch = workspace.epoch
    release_workspace()
    assert workspace.epoch != epoch
    remade = slots("test.slots", schedule, CPU)
    assert remade is not kept
    for chunk in range(4):
        assert _inside(remade(chunk, 0), remade.rows)
