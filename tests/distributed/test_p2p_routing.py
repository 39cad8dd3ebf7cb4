"""Which way ``commpress.transport.p2p.Batch`` posts: CPU tensors on gloo straight on the
process group; tensors on a device on a group that moves host memory only staged through
host memory, then posted the same way; anything else through ``batch_isend_irecv``
(which NCCL needs, and which a group naming several backends may hand a CUDA tensor to
NCCL with). A meta tensor stands in for a CUDA one."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress.bench.collectives import output_for, run_collective
from commpress.cluster.local import run_distributed
from commpress.testing.silence import forbid_communication
from commpress.transport import p2p


def _routes(rank, world_size, backend):
    taken = []
    saved = p2p.post_each, dist.batch_isend_irecv, dist.get_backend
    p2p.post_each = lambda group, sends, receives, tag: taken.append(
        ["each", *(t.device.type for t, _ in (*sends, *receives))]
    ) or []  # fmt: skip
    dist.batch_isend_irecv = lambda ops: taken.append(["batched"]) or []
    dist.get_backend = lambda group=None: backend
    try:
        p2p.Batch(None, [(torch.zeros(4, dtype=torch.uint8), 0)], [])
        p2p.Batch(None, [], [(torch.zeros(4, dtype=torch.uint8, device="meta"), 0)])
        mixed = [(torch.zeros(4, dtype=torch.uint8), 0)]
        p2p.Batch(None, mixed, [(torch.zeros(4, dtype=torch.uint8, device="meta"), 0)])
    finally:
        p2p.post_each, dist.batch_isend_irecv, dist.get_backend = saved
    with forbid_communication():
        p2p.Batch(None, [], []).wait()  # nothing to post: nothing reaches the network
    return taken


def test_cpu_tensors_on_gloo_are_posted_one_by_one_and_others_staged_through_host():
    (taken,) = run_distributed(_routes, 1, "gloo", timeout=60)
    assert taken == [["each", "cpu"], ["each", "cpu"], ["each", "cpu", "cpu"]]


def test_a_group_that_names_nccl_gets_its_device_tensors_batched_unstaged():
    (taken,) = run_distributed(_routes, 1, "cpu:gloo,cuda:nccl", timeout=60)
    assert taken == [["each", "cpu"], ["batched"], ["batched"]]


def _without_copy_in(self, timeout=None):
    """``Batch.wait`` that forgets to copy staged receives back (broken on purpose)."""
    for work in self._works:
        p2p.wait(work, timeout)


def _forced_staging(count: list | None = None):
    """Stage every message through host memory, as CUDA tensors on gloo are; each staged
    send appended to ``count``. Returns what to restore."""
    originals = p2p.must_stage, p2p._host_copy, p2p.Batch.wait
    p2p.must_stage = lambda group, on_cpu: True
    if count is not None:
        p2p._host_copy = lambda t: count.append(t) or originals[1](t)
    return originals


def _restore(originals) -> None:
    p2p.must_stage, p2p._host_copy, p2p.Batch.wait = originals


def _exchange(rank, world_size, broken):
    """What this rank receives from its left neighbour, every message staged."""
    originals = _forced_staging()
    if broken:
        p2p.Batch.wait = _without_copy_in
    try:
        sent = torch.arange(1000, dtype=torch.float32) + 1000 * rank
        received = torch.zeros(1000)
        p2p.exchange(None, sent, (rank + 1) % world_size, received, (rank - 1) % world_size).wait()
    finally:
        _restore(originals)
    return received


@pytest.mark.parametrize("broken", [False, True], ids=["staged", "broken-copy-in"])
def test_a_staged_receive_holds_what_was_sent(broken):
    received = run_distributed(_exchange, 3, broken, timeout=60)
    for rank, got in enumerate(received):
        left = (rank - 1) % 3
        expected = torch.arange(1000, dtype=torch.float32) + 1000 * left
        assert torch.equal(got, expected) != broken, rank  # a receive not copied back: caught


def _staged_and_direct(rank, world_size):
    """Per collective: its output with every message staged through host memory, the
    number of staged sends, and its output with the messages posted as they are."""
    inp = torch.randn(3000, generator=torch.Generator().manual_seed(rank))
    outputs = {}
    for name in ("all_gather", "reduce_scatter", "all_reduce"):
        staged = []
        originals = _forced_staging(staged)
        try:
            through_host = _output(name, inp, world_size)
        finally:
            _restore(originals)
        outputs[name] = (through_host, len(staged), _output(name, inp, world_size))
    return outputs


def _output(op, inp, world_size):
    out = output_for(op, inp, world_size).fill_(float("nan"))  # every element must be written
    run_collective(op, "ring", "int8", inp, out)
    return out


def test_collectives_staged_through_host_memory_give_the_same_bits():
    for outputs in run_distributed(_staged_and_direct, 3, timeout=120):
        for name, (through_host, staged, direct) in outputs.items():
            assert staged > 0, name  # the forced staging was taken
            assert torch.equal(through_host, direct), name


USER_NUMEL = 1 << 18  # a user's message of 1 MiB: larger than any receive it could meet
USER_TIMEOUT = timedelta(seconds=5)
BESIDE_USER_MESSAGES = {  # op, spec, elements per rank
    "ring all-gather": ("all_gather", "none@ring", 1000),
    "two-rank backend all-gather, point to point": ("all_gather", "int8@backend", 1 << 19),
    "alltoall reduce-scatter, point to point": ("reduce_scatter", "int8@alltoall", 1 << 20),
}


def _collective(op, spec, inp, world_size):
    """Its output, or its error's message."""
    out = output_for(op, inp, world_size).fill_(float("nan"))
    codec, algorithm = spec.split("@")
    call = cp.all_gather_into_tensor if op == "all_gather" else cp.reduce_scatter_tensor
    try:
        call(out, inp, codec=codec, algorithm=algorithm, timeout=USER_TIMEOUT)
    except RuntimeError as error:
        return str(error)
    return out


def _beside_user_messages(rank, world_size, op, spec, numel, tag):
    """A user's message of torch's default tag from rank 1 to rank 0, sent before a
    compressed collective and received after it: what rank 0 received, and the
    collective's output (or its error) beside the same collective's output alone."""
    p2p.COLLECTIVES_TAG = tag
    inp = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    message = torch.arange(USER_NUMEL, dtype=torch.float32)
    sent = dist.isend(message, dst=0) if rank == 1 else None
    beside = _collective(op, spec, inp, world_size)
    received = torch.full((USER_NUMEL,), float("nan"))
    try:
        if rank == 0:
            dist.irecv(received, src=1).wait(USER_TIMEOUT)
        else:
            sent.wait(USER_TIMEOUT)
    except RuntimeError:
        return beside, None, None  # the group's connections are closed after a timeout
    return beside, received, _collective(op, spec, inp, world_size)


@pytest.mark.parametrize("case", list(BESIDE_USER_MESSAGES))
def test_a_users_own_messages_on_the_group_never_meet_the_collectives(case):
    op, spec, numel = BESIDE_USER_MESSAGES[case]
    results = run_distributed(_beside_user_messages, 2, op, spec, numel, p2p.COLLECTIVES_TAG)
    for rank, (beside, received, alone) in enumerate(results):
        assert isinstance(beside, torch.Tensor) and isinstance(alone, torch.Tensor), (beside, alone)
        assert torch.equal(beside, alone), rank
        if rank == 0:
            assert torch.equal(received, torch.arange(USER_NUMEL, dtype=torch.float32))


def test_on_the_users_tag_a_collective_meets_a_users_message():
    """The test above, broken on purpose: the collectives' messages on tag 0 as a user's.
    Rank 0's collective takes the user's message: it raises (a timeout, as seen), or gloo
    ends the process on a size it did not expect; either way the user's message is lost."""
    op, spec, numel = BESIDE_USER_MESSAGES["ring all-gather"]
    ranks = run_distributed(
        _beside_user_messages, 2, op, spec, numel, 0, timeout=60, allow_dead=True
    )
    if ranks[0] is None:  # ended by gloo
        return
    beside, received, _ = ranks[0]
    assert isinstance(beside, str), beside  # an error, not an output
    assert received is None or not torch.equal(
        received, torch.arange(USER_NUMEL, dtype=torch.float32)
    )
