"""A ring posts each later receive one step ahead: gloo moves a point-to-point message only
once its receive is posted, so a receive posted after the sender's send leaves the link
idle (``benchmarks/small_messages_2026-11-26/README.md``, "Receives posted ahead"). A
checked ring does so from its left neighbour's first header on; an unchecked one (the
all-gather inside an all-reduce) from its first step."""

from __future__ import annotations

import torch

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.codecs import get_codec
from commpress.collectives import inband, payloads
from commpress.collectives.all_gather import gather
from commpress.collectives.reduce_scatter import reduce
from commpress.transport import p2p


def _posts(rank, world_size, op, checked=True, first_message_bytes=None):
    """What this rank did, in order: ("posted" | "waited", "send" | "receive", index among
    its kind). ``first_message_bytes``: where the in-band check cuts a first message."""
    events, counts, names = [], {"send": 0, "receive": 0}, {}
    first_message = inband.FIRST_MESSAGE_BYTES
    if first_message_bytes is not None:
        inband.FIRST_MESSAGE_BYTES = first_message_bytes
    post_each, wait = p2p.post_each, p2p.wait

    def recording(group, sends, receives, tag):
        works = post_each(group, sends, receives, tag)
        kinds = ["receive"] * len(receives) + ["send"] * len(sends)  # as posted
        for kind, work in zip(kinds, works, strict=True):
            names[id(work)] = (kind, counts[kind])
            events.append(("posted", kind, counts[kind]))
            counts[kind] += 1
        return works

    def waiting(work, timeout):
        if id(work) in names:
            events.append(("waited", *names[id(work)]))
        return wait(work, timeout)

    begin = payloads.Gathered.begin

    def beginning(gathered):
        events.append(("began",))
        return begin(gathered)

    p2p.post_each, p2p.wait, payloads.Gathered.begin = recording, waiting, beginning
    try:
        if op == "all_gather":
            inp = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
            out = torch.empty(1000 * world_size)
            if checked:
                cp.all_gather_into_tensor(out, inp, codec="int8")
            else:
                gather(out, inp, None, get_codec("int8"), "ring", None)
            exact = None  # lossy codec: the test compares with the round trip
        else:
            base = torch.arange(1000 * world_size, dtype=torch.float32)
            out = torch.empty(1000)
            if checked:
                cp.reduce_scatter_tensor(out, base + rank, codec="none")
            else:
                out.copy_(reduce(base + rank, None, get_codec("none"), "ring", 1 << 20, None, None))
            expected = world_size * base.view(world_size, -1)[rank] + sum(range(world_size))
            exact, out = bool(torch.equal(out, expected)), None  # small integers: exact
    finally:
        p2p.post_each, p2p.wait, payloads.Gathered.begin = post_each, wait, begin
        inband.FIRST_MESSAGE_BYTES = first_message
    return events, exact, out


def _assert_ahead(events, steps, checked=True):
    at = {event: position for position, event in enumerate(events)}
    for k in range(steps):
        for kind in ("send", "receive"):
            assert ("posted", kind, k) in at and ("waited", kind, k) in at, (kind, k, events)
    # the first receive before the first send: gloo's sender waits for the receive
    assert at["posted", "receive", 0] < at["posted", "send", 0], events
    for k in range(steps - 1):  # each next receive is ready before this step's has arrived
        if k or not checked:
            assert at["posted", "receive", k + 1] < at["waited", "receive", k], (k, events)
        assert at["posted", "receive", k + 1] < at["waited", "send", k], (k, events)
    if checked:
        for k in range(1, steps):  # but only once the left neighbour's first header has come
            assert at["posted", "receive", k] > at["waited", "receive", 0], (k, events)
    else:  # from the start: the first two receives before the first send is even waited
        assert at["posted", "receive", 1] < at["waited", "receive", 0], events
        if ("began",) in at:  # an all-gather decodes its own shard during the first transfer
            assert at["posted", "send", 0] < at["began",] < at["waited", "receive", 0], events


def _gathered_exactly(results, world_size) -> bool:
    """Every rank's output is every rank's int8 round trip, bit for bit."""
    codec = get_codec("int8")
    shards = [
        torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(world_size)
    ]
    expected = torch.cat([codec.decode(codec.encode(x), 1000, torch.float32) for x in shards])
    return all(torch.equal(out, expected) for _, _, out in results)


def test_a_ring_all_gather_posts_each_next_receive_before_waiting_its_send():
    results = run_distributed(_posts, 4, "all_gather", timeout=60)
    for posted, _, _ in results:
        _assert_ahead(posted, 3)
    assert _gathered_exactly(results, 4)


def test_a_ring_reduce_scatter_posts_each_next_receive_before_waiting_its_send():
    for posted, exact, _ in run_distributed(_posts, 4, "reduce_scatter", timeout=60):
        assert exact
        _assert_ahead(posted, 3)


def test_an_unchecked_ring_posts_its_receives_ahead_from_the_first_step():
    results = run_distributed(_posts, 4, "all_gather", False, timeout=60)
    for posted, _, _ in results:
        assert ("began",) in posted
        _assert_ahead(posted, 3, checked=False)
    assert _gathered_exactly(results, 4)
    for posted, exact, _ in run_distributed(_posts, 4, "reduce_scatter", False, timeout=60):
        assert exact
        _assert_ahead(posted, 3, checked=False)


def test_on_two_ranks_a_cut_first_message_has_its_receive_posted_before_its_rest_is_sent():
    """On two ranks a ring's step is one exchange with one peer, which gloo at times
    serialises when both sides post their sends before their receives (64 MiB all-gather
    on 2 emulated hosts: about twice the time, ``benchmarks/two_ranks_2026-11-27/``). A
    first message cut in two (here from 256 bytes) sends its rest only once the left's
    rest has its receive. On three ranks the rest goes to another peer than the one it
    comes from, and is sent at once, as before."""
    results = run_distributed(_posts, 2, "all_gather", True, 256, timeout=60)
    for posted, _, _ in results:
        at = {event: position for position, event in enumerate(posted)}
        # receive 0 / send 0: the first parts; receive 1 / send 1: the rests
        assert at["posted", "receive", 0] < at["posted", "send", 0], posted
        assert at["posted", "receive", 1] < at["posted", "send", 1], posted
        assert at["waited", "receive", 1] > at["posted", "send", 1], posted
    assert _gathered_exactly(results, 2)
    results = run_distributed(_posts, 3, "all_gather", True, 256, timeout=60)
    for posted, _, _ in results:
        at = {event: position for position, event in enumerate(posted)}
        assert at["posted", "send", 1] < at["waited", "receive", 0], posted
    assert _gathered_exactly(results, 3)
