"""Which way ``commpress.transport.p2p.Batch`` posts: CPU tensors on gloo straight on the
process group, anything else through ``batch_isend_irecv`` (which NCCL needs, and which a
group naming several backends may hand a CUDA tensor to NCCL with)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from commpress.cluster.local import run_distributed
from commpress.testing.silence import forbid_communication
from commpress.transport import p2p


def _routes(rank, world_size):
    taken = []
    saved = p2p.post_each, dist.batch_isend_irecv
    p2p.post_each = lambda group, sends, receives: taken.append("each") or []
    dist.batch_isend_irecv = lambda ops: taken.append("batched") or []
    try:
        p2p.Batch(None, [(torch.zeros(4, dtype=torch.uint8), 0)], [])
        p2p.Batch(None, [], [(torch.zeros(4, dtype=torch.uint8, device="meta"), 0)])
        mixed = [(torch.zeros(4, dtype=torch.uint8), 0)]
        p2p.Batch(None, mixed, [(torch.zeros(4, dtype=torch.uint8, device="meta"), 0)])
    finally:
        p2p.post_each, dist.batch_isend_irecv = saved
    with forbid_communication():
        p2p.Batch(None, [], []).wait()  # nothing to post: nothing reaches the network
    return taken


def test_only_cpu_tensors_on_gloo_are_posted_one_by_one():
    (taken,) = run_distributed(_routes, 1, timeout=60)
    assert taken == ["each", "batched", "batched"]
