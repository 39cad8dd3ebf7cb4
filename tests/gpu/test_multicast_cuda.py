"""The multicast all-gather on CUDA tensors: each payload encoded on the GPU, staged
through host memory for the UDP transport, copied back and decoded on the GPU. Two
emulated hosts (network namespaces: root and iproute2) share the one GPU.

Never run so far: no GPU has been lent to this project (the same path on CPU tensors,
with the staging forced, is ``tests/cluster/test_multicast.py::
test_payloads_staged_through_host_memory_gather_the_same_bits``).
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import commpress as cp
from commpress.cluster import Emulated
from commpress.codecs import get_codec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
        reason="the emulated cluster needs root and iproute2",
    ),
]

SHARD = 300_000


def _shard(rank: int) -> torch.Tensor:
    return torch.randn(SHARD, generator=torch.Generator().manual_seed(1000 + rank)).cuda()


def _gather_on_cuda(rank, world_size):
    torch.cuda.set_device(0)
    codec = get_codec("int8")
    shards = [_shard(r) for r in range(world_size)]
    expected = torch.cat([codec.decode(codec.encode(s), SHARD, s.dtype) for s in shards])
    out = torch.empty(world_size * SHARD, device="cuda")
    exact = []
    for _ in range(2):  # the second call runs its check beside the broadcasts
        out.fill_(float("nan"))
        cp.all_gather_into_tensor(out, shards[rank], codec="int8", algorithm="multicast")
        exact.append(bool(torch.equal(out, expected)))
    return exact


def test_cuda_tensors_gather_the_decoded_shards_on_every_rank():
    with Emulated(2, "1gbit", prefix="cpg") as cluster:
        results = cluster.run(_gather_on_cuda, timeout=300)
    for rank, exact in enumerate(results):
        assert all(exact), (rank, exact)
