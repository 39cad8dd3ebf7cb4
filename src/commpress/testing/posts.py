"""``with recorded_posts() as posted: call()``: every send and receive the transport posts
straight on a process group (:func:`commpress.transport.p2p.post_each`) inside the block,
in posting order, as ``(kind, peer, bytes)`` with ``kind`` ``"receive"`` or ``"send"`` and
``peer`` a group rank. The posts themselves go ahead."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from commpress.transport import p2p


@contextlib.contextmanager
def recorded_posts() -> Iterator[list[tuple[str, int, int]]]:
    posted: list[tuple[str, int, int]] = []
    post_each = p2p.post_each

    def recording(group, sends, receives, tag):
        works = post_each(group, sends, receives, tag)
        kinds = [("receive", t, peer) for t, peer in receives] + [
            ("send", t, peer) for t, peer in sends
        ]  # as post_each posts them
        posted.extend((kind, peer, t.numel() * t.element_size()) for kind, t, peer in kinds)
        return works

    p2p.post_each = recording
    try:
        yield posted
    finally:
        p2p.post_each = post_each
