"""The multicast all-gather on CUDA tensors: each payload encoded on the GPU, staged
through host memory for the UDP transport, copied back and decoded on the GPU. Two
emulated hosts share the one GPU, on a gloo group (NCCL groups are refused for multicast:
its set-up and argument check move CPU tensors on the group).

Never run so far: no GPU has been lent to this project (the same path on CPU tensors,
with the staging forced, is ``test_multicast.py::
test_payloads_staged_through_host_memory_gather_the_same_bits``).
"""

from __future__ import annotations

import pytest
import torch

import commpress as cp
from commpress.cluster import Emulated
from commpress.codecs import get_codec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHARD = 300_000


def _shard(call: int, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * call + rank)
    return torch.randn(SHARD, generator=generator).cuda()


def _gather_on_cuda(rank, world_size):
    torch.cuda.set_device(0)
    codec = get_codec("int8")
    out = torch.empty(world_size * SHARD, device="cuda")
    exact = []
    for call in range(3):  # inputs of its own each time; from the second, the check beside
        shards = [_shard(call, r) for r in range(world_size)]
        expected = torch.cat([codec.decode(codec.encode(s), SHARD, s.dtype) for s in shards])
        out.fill_(float("nan"))
        cp.all_gather_into_tensor(out, shards[rank], codec="int8", algorithm="multicast")
        exact.append(bool(torch.equal(out, expected)))
    return exact


def test_cuda_tensors_gather_the_decoded_shards_on_every_rank(prefix):
    with Emulated(2, "1gbit", prefix=prefix) as cluster:
        results = cluster.run(_gather_on_cuda, timeout=300)
    for rank, exact in enumerate(results):
        assert all(exact), (rank, exact)
