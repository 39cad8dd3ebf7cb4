"""The order in which point-to-point transfers are posted, and where receives go ahead."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from commpress.codecs import get_codec
from commpress.collectives import executor, payloads
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


class _PiecesPayloads(_RecordingPayloads):
    def __init__(self, events, in_any_order: bool):
        super().__init__(events)
        self.encodes_in_any_order = in_any_order

    def encode_own(self, send):
        self.events.append(f"encode {send.piece}")


def _alltoall_events(monkeypatch, in_any_order: bool) -> list[str]:
    events = []
    monkeypatch.setattr(executor, "_start", lambda *args: events.append("post") or _Done())
    int8 = get_codec("int8")
    (schedule,) = plan(
        "reduce_scatter", "alltoall", 0, 3, 3 * 3072, torch.float32, int8, chunk_bytes=4096
    )
    assert len(schedule.steps) == 3  # three pieces of 1024 elements, each one step
    executor.execute(schedule, _PiecesPayloads(events, in_any_order), None, None)
    return events


def test_an_all_to_alls_pieces_are_encoded_as_they_are_posted(monkeypatch):
    """Each piece of an ``alltoall`` is encoded while the piece before it is on the wire,
    where the order of the encodes cannot change the bits: encoding every piece before the
    first transfer left the encode of a whole chunk unoverlapped (2 hosts, 64 MiB, int4:
    the ring 43 ms, ``alltoall`` 56 ms for the same bytes)."""
    events = _alltoall_events(monkeypatch, in_any_order=True)
    handles = ["handle 1", "handle 2"] * 3
    assert events == [
        "encode 0", "encode 0", "post", "begin", "encode 1", "encode 1", "post",
        "encode 2", "encode 2", "post", *handles,
    ]  # fmt: skip


def test_an_all_to_alls_encodes_all_come_first_where_their_order_matters(monkeypatch):
    """Stochastic rounding draws its noise chunk by chunk (the bits do not depend on
    ``chunk_bytes``), and error feedback must not be left half updated by a failed call."""
    events = _alltoall_events(monkeypatch, in_any_order=False)
    encodes = [f"encode {piece}" for piece in (0, 1, 2)] * 2
    handles = ["handle 1", "handle 2"] * 3
    assert events == [*encodes, "post", "begin", "post", "post", *handles]


def test_only_encodes_that_draw_no_noise_nor_feed_errors_back_go_in_any_order():
    (schedule,) = plan("reduce_scatter", "alltoall", 0, 2, 8192, torch.float32, get_codec("int8"))
    contributions = torch.zeros(2, 4096)

    def in_any_order(codec, residual=None) -> bool:
        return payloads.Contributions(contributions, codec, schedule, residual).encodes_in_any_order

    class Foreign:  # a codec object of the user's: it may draw noise without saying so
        lossless = False

    assert in_any_order(get_codec("int8"))
    assert in_any_order(get_codec("none"))
    assert not in_any_order(get_codec("int8:stochastic=true"))
    assert not in_any_order(get_codec("int8"), residual=torch.zeros(2, 4096))
    assert not in_any_order(Foreign())
