"""Prove that a call does not communicate: every torch.distributed operation raises inside.

``with forbid_communication(): call()`` replaces torch.distributed's point-to-point and
collective functions, and the transport's own posting of sends and receives straight on a
process group (:func:`commpress.transport.p2p.post_each`), by ones that raise
:class:`CommunicationAttempted`, on every thread (the communication thread included),
so a call that reaches the network inside the block fails loudly instead of passing
unnoticed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist

from commpress.transport import p2p

#: Every torch.distributed function that moves data or synchronises ranks. ``isend`` and
#: ``irecv`` stay: ``P2POp`` checks their identity, and ``batch_isend_irecv`` sends them.
OPERATIONS = (
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "monitored_barrier",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "new_group",
)


class CommunicationAttempted(AssertionError):
    """Raised by a torch.distributed operation called inside :func:`forbid_communication`."""


@contextlib.contextmanager
def forbid_communication() -> Iterator[list[str]]:
    """Within the block every operation of :data:`OPERATIONS` raises; yields the list of
    the names that were attempted (for a test that wants to inspect them)."""
    attempted: list[str] = []
    originals = {name: getattr(dist, name) for name in OPERATIONS if hasattr(dist, name)}

    def refuse(name: str):
        def operation(*args, **kwargs):
            attempted.append(name)
            raise CommunicationAttempted(f"torch.distributed.{name} called")

        return operation

    for name in originals:
        setattr(dist, name, refuse(name))
    post_each, p2p.post_each = p2p.post_each, refuse("ProcessGroup.send/recv")
    try:
        yield attempted
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
        p2p.post_each = post_each
