"""The order in which point-to-point transfers are posted, and where receives go ahead."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from commpress.codecs import get_codec
from commpress.collectives import executor
from commpress.schedules import plan
from commpress.transport import objects, p2p


class _RecordingGroup:
    def __init__(self):
        self.calls = []

        self.tags = []

    def send(self, tensors, peer, tag):
        self.calls.append(("send", peer))
        self.tags.append(tag)
        return ("send", peer)

    def recv(self, tensors, peer, tag):
        self.calls.append(("recv", peer))
        self.tags.append(tag)
        return ("recv", peer)


def test_post_each_posts_every_receive_before_any_send():
    """gloo's sender waits for its receive to be posted: a batch's receives go first."""
    group = _RecordingGroup()
    one = torch.zeros(4, dtype=torch.uint8)
    works = p2p.post_each(group, [(one, 1), (one, 2)], [(one, 3), (one, 0)], 77)
    assert group.calls == [("recv", 3), ("recv", 0), ("send", 1), ("send", 2)]
    assert works == group.calls
    assert group.tags == [77] * 4


def test_the_collectives_own_messages_have_a_tag_of_their_own():
    """Not 0, the tag of a user's ``dist.send``/``recv`` by default, nor the set-up
    exchange's (``tests/distributed/test_p2p_routing.py`` runs them side by side)."""
    assert p2p.COLLECTIVES_TAG not in (0, objects.SET_UP_TAG)
    assert 0 < p2p.COLLECTIVES_TAG < 2**31  # gloo's tag is a C int


def test_receives_go_ahead_only_for_a_chain_of_cpu_tensors_off_nccl(monkeypatch):
    ring, backend = (
        plan("all_gather", name, 1, 4, 4000, torch.float32, get_codec("int8"))[0]
        for name in ("ring", "backend")
    )
    on_cpu, on_meta = (
        SimpleNamespace(device=torch.device("cpu")),
        SimpleNamespace(device=torch.device("meta")),
    )
    made = (("gloo", "cpu:gloo,cuda:gloo", True), ("nccl", "cuda:nccl", False))
    for name, pairs, expected in made:
        monkeypatch.setattr(p2p.dist, "get_backend", lambda group=None, name=name: name)
        monkeypatch.setattr(p2p.dist, "get_backend_config", lambda group=None, p=pairs: p)
        assert executor._may_receive_ahead(ring, on_cpu, None) is expected
        assert not executor._may_receive_ahead(ring, on_meta, None)
        assert not executor._may_receive_ahead(backend, on_cpu, None)


class _Done:
    def wait(self, timeout):
        pass


class _RecordingPayloads:
    """Records what the executor asks of a run's payloads, in order."""

    encodes_change_state, device, held_bytes = False, torch.device("cpu"), 0

    def __init__(self, events):
        self.events = events

    def encode_own(self, send):
        self.events.append("encode")

    def begin(self):
        self.events.append("begin")

    def handle(self, receive):
        self.events.append(f"handle {receive.src}")


def test_the_own_payloads_work_overlaps_the_first_transfer(monkeypatch):
    """A schedule that is not a chain (here ``backend``'s one all-gather) begins its
    payloads (decodes the own shard) once the transfer is posted, not before: the slowest
    rank's decode would otherwise delay every rank's all-gather."""
    events = []
    monkeypatch.setattr(executor, "_start", lambda *args: events.append("post") or _Done())
    (schedule,) = plan("all_gather", "backend", 0, 3, 4096, torch.float32, get_codec("int8"))
    executor.execute(schedule, _RecordingPayloads(events), None, None)
    assert events == ["encode", "post", "begin", "handle 1", "handle 2"]


def test_a_run_without_transfers_still_begins_its_payloads():
    events = []
    (schedule,) = plan("all_gather", "backend", 0, 1, 4096, torch.float32, get_codec("int8"))
    executor.execute(schedule, _RecordingPayloads(events), None, None)
    assert events == ["begin"]
