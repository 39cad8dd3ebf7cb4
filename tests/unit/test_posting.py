"""The order in which point-to-point transfers are posted, and where receives go ahead."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from commpress.codecs import get_codec
from commpress.collectives import executor
from commpress.schedules import plan
from commpress.transport import p2p


class _RecordingGroup:
    def __init__(self):
        self.calls = []

    def send(self, tensors, peer, tag):
        self.calls.append(("send", peer))
        return ("send", peer)

    def recv(self, tensors, peer, tag):
        self.calls.append(("recv", peer))
        return ("recv", peer)


def test_post_each_posts_every_receive_before_any_send():
    """gloo's sender waits for its receive to be posted: a batch's receives go first."""
    group = _RecordingGroup()
    one = torch.zeros(4, dtype=torch.uint8)
    works = p2p.post_each(group, [(one, 1), (one, 2)], [(one, 3), (one, 0)])
    assert group.calls == [("recv", 3), ("recv", 0), ("send", 1), ("send", 2)]
    assert works == group.calls


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
