"""A checked ring posts each later receive one step ahead: gloo moves a point-to-point
message only once its receive is posted, so a receive posted after the sender's send
leaves the link idle (``benchmarks/small_messages_2026-11-26/README.md``)."""

from __future__ import annotations

import torch

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.transport import p2p


def _posts(rank, world_size, op):
    """The order in which this rank posts its sends and receives: ("send" | "receive",
    index among its kind)."""
    posted, counts = [], {"send": 0, "receive": 0}
    post_each = p2p.post_each

    def recording(group, sends, receives):
        for kind, items in (("send", sends), ("receive", receives)):
            for _ in items:
                posted.append((kind, counts[kind]))
                counts[kind] += 1
        return post_each(group, sends, receives)

    p2p.post_each = recording
    try:
        if op == "all_gather":
            inp = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
            out = torch.empty(1000 * world_size)
            cp.all_gather_into_tensor(out, inp, codec="int8")
            exact = None  # lossy codec: the ranks' agreement is checked by the test
        else:
            base = torch.arange(1000 * world_size, dtype=torch.float32)
            out = torch.empty(1000)
            cp.reduce_scatter_tensor(out, base + rank, codec="none")
            expected = world_size * base.view(world_size, -1)[rank] + sum(range(world_size))
            exact, out = bool(torch.equal(out, expected)), None  # small integers: exact
    finally:
        p2p.post_each = post_each
    return posted, exact, out


def _assert_ahead(posted, steps):
    where = {event: position for position, event in enumerate(posted)}
    for k in range(steps):
        assert ("receive", k) in where and ("send", k) in where, posted
    for k in range(1, steps):  # the first waits for the left neighbour's header
        assert where["receive", k] < where["send", k], (k, posted)


def test_a_ring_all_gather_posts_each_later_receive_before_its_send():
    results = run_distributed(_posts, 4, "all_gather", timeout=60)
    for posted, _, _ in results:
        _assert_ahead(posted, 3)
    first = results[0][2]
    assert all(torch.equal(out, first) for _, _, out in results)


def test_a_ring_reduce_scatter_posts_each_later_receive_before_its_send():
    for posted, exact, _ in run_distributed(_posts, 4, "reduce_scatter", timeout=60):
        assert exact
        _assert_ahead(posted, 3)
