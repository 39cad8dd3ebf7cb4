"""transport.owned_groups' agreement, on every rank's offers written by hand: which group
each rank takes is decided from what all ranks said, so ranks never part ways."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.distributed as dist

from commpress.transport import owned_groups
from commpress.transport.owned_groups import _Made

REQUEST = ("ddp hook", None, None, None)


class _Owner:
    pass


@pytest.fixture
def made(monkeypatch):
    """This process as rank 0, with an empty record; ``new_group`` gives numbered names."""
    monkeypatch.setattr(owned_groups, "_made", {})
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    created = []

    def new_group(ranks=None, timeout=None, backend=None):
        created.append(f"new {len(created)}")
        return created[-1]

    monkeypatch.setattr(dist, "new_group", new_group)
    return owned_groups._made


def test_a_group_every_rank_offers_is_taken_over(made):
    made[REQUEST] = [_Made("G0"), _Made("G1")]
    everyone = [([REQUEST], [(2, [0, 1])]), ([REQUEST], [(2, [1])])]
    assert owned_groups.take(_Owner(), [REQUEST], everyone) == ["G1"]


def test_a_group_one_rank_does_not_offer_is_not_taken_over(made):
    made[REQUEST] = [_Made("G0")]
    everyone = [([REQUEST], [(1, [0])]), ([REQUEST], [(1, [])])]
    assert owned_groups.take(_Owner(), [REQUEST], everyone) == ["new 0"]
    assert [entry.group for entry in made[REQUEST]] == ["G0", "new 0"]


def test_lists_out_of_step_between_ranks_start_afresh_on_every_rank(made):
    """A new_group that failed on one rank left its list one shorter: the same position
    named different groups on the two ranks (rank 0 would take G0, rank 1 its G1)."""
    made[REQUEST] = [_Made("G0"), _Made("G1")]
    everyone = [([REQUEST], [(2, [0, 1])]), ([REQUEST], [(1, [0])])]
    assert owned_groups.take(_Owner(), [REQUEST], everyone) == ["new 0"]
    assert [entry.group for entry in made[REQUEST]] == ["new 0"]


def test_requests_that_differ_raise_naming_the_ranks(made):
    other = ("ddp hook", None, None, 5)
    everyone = [([REQUEST], [(0, [])]), ([other], [(0, [])])]
    with pytest.raises(ValueError, match=r"ranks \[1\] asked for other process groups"):
        owned_groups.take(_Owner(), [REQUEST], everyone)


def test_a_group_taken_is_its_owners_until_the_owner_is_gone(made, monkeypatch):
    monkeypatch.setattr(owned_groups, "registered", lambda group: True)
    owner = _Owner()
    made[REQUEST] = [_Made("G0")]
    owned_groups.take(owner, [REQUEST], [([REQUEST], [(1, [0])])])
    assert not made[REQUEST][0].offered()
    del owner
    assert made[REQUEST][0].offered()


def test_a_destroyed_group_is_let_go_of_and_never_offered(monkeypatch):
    monkeypatch.setattr(owned_groups, "registered", lambda group: False)
    entry = _Made("G0")
    assert not entry.offered()
    assert entry.group is None  # its connections may close


class _Work:
    def __init__(self, error: Exception | None = None):
        self.done = False
        self.future = torch.futures.Future()
        if error is None:
            self.future.set_result(None)
        else:
            self.future.set_exception(error)

    def get_future(self):
        return self.future

    def is_completed(self):
        return self.done


class _GlooReduceScatterWork:
    """gloo's ``reduce_scatter_tensor`` work (torch 2.13): no future, and ``is_completed``
    False even once waited for."""

    def get_future(self):
        raise RuntimeError("Work::getFuture not implemented.")

    def is_completed(self):
        return False


class _Group:
    """A process group's stand-in (weakly referable, as torch's are)."""


@pytest.fixture
def owned_group(monkeypatch):
    group = _Group()
    monkeypatch.setattr(owned_groups, "_owned", {id(group)})
    monkeypatch.setattr(owned_groups, "_failed", weakref.WeakSet())
    monkeypatch.setattr(owned_groups, "_in_flight", {})
    return group


def test_a_work_keeps_its_group_pending_until_it_completes(owned_group):
    work = _Work()
    assert owned_groups.track(owned_group, work) is work
    assert owned_groups._pending(owned_group)
    work.done = True
    assert not owned_groups._pending(owned_group)


def test_a_work_completed_with_an_error_marks_its_group_failed(owned_group):
    """An abandoned all-reduce that timed out (gloo then closes the group's connections) left
    its group pending no more, and so offered again: the next owner's first collective
    failed on every rank."""
    work = _Work(RuntimeError("Timed out waiting 1000ms for recv operation to complete"))
    owned_groups.track(owned_group, work)
    assert owned_groups._pending(owned_group)
    work.done = True
    assert not owned_groups._pending(owned_group)
    assert owned_group in owned_groups._failed


def test_a_work_waited_for_is_let_go_of_and_the_others_kept(owned_group):
    """gloo's Work holds its tensors: a DDP hook's last bucket, tracked until the group's
    next collective, outlived its model and hook."""
    first, second = _Work(), _Work()
    owned_groups.track(owned_group, first)
    owned_groups.track(owned_group, second)
    first.done = True
    owned_groups.waited(first)
    assert owned_groups._in_flight[owned_group] == [second]
    owned_groups.waited(_Work())  # one never tracked: nothing changes
    assert owned_groups._in_flight[owned_group] == [second]
    second.done = True
    owned_groups.waited(second)
    assert owned_group not in owned_groups._in_flight


def test_a_work_that_never_says_it_completed_is_not_tracked(owned_group):
    """Tracked by polling, gloo's reduce-scatter work kept its group pending for ever: an
    FSDP twin that had run a native reduce-scatter was never taken over."""
    work = _GlooReduceScatterWork()
    assert owned_groups.track(owned_group, work) is work
    assert not owned_groups._pending(owned_group)


@pytest.mark.parametrize(
    ("algorithm", "cuda", "runs_on"),
    [("native", True, "fsdp"), ("native", False, "twin"), ("ring", True, "twin")],
)
def test_native_on_cuda_stays_on_fsdps_group_and_everything_else_on_the_twin(
    algorithm, cuda, runs_on
):
    """On CUDA no timeout reaches torch's NCCL collective, so ``native`` moved to the twin
    only made the twin's communicator for it; on CPU the twin's timeout bounds it."""
    from types import SimpleNamespace

    from commpress.integrations.groups import OwnGroups

    groups = OwnGroups.__new__(OwnGroups)
    groups.twin = lambda group: "twin"
    tensor = SimpleNamespace(is_cuda=cuda)
    chosen = groups.for_call("fsdp", algorithm, tensor)
    assert chosen == runs_on


def test_a_work_on_cuda_tensors_is_not_tracked(owned_group):
    """A group's last work stays tracked until the group's next: on CUDA tensors it kept an
    FSDP all-gather's output in GPU memory, and NCCL's future says nothing of errors."""
    work = _Work()
    assert owned_groups.track(owned_group, work, on_cpu=False) is work
    assert not owned_groups._pending(owned_group)
