"""Async handles, and what a stalled or dead peer does to everyone else."""

from __future__ import annotations

import importlib
import os
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import commpress as cp
from commpress.cluster.local import run_distributed
from commpress.testing.stall import outcome, stall, timed_outcome


def _async_equals_sync(rank, world_size):
    inp = torch.randn(10_000, generator=torch.Generator().manual_seed(rank))
    gathered, scattered, reduced = (
        torch.empty(10_000 * world_size),
        torch.empty(2_500),
        inp.clone(),
    )
    works = [
        cp.all_gather_into_tensor(gathered, inp, codec="int8", async_op=True),
        cp.reduce_scatter_tensor(scattered, inp, codec="int8", async_op=True),
        cp.all_reduce(reduced, codec="int8", algorithm="alltoall", async_op=True),
    ]
    for work in works:
        assert work.wait() is True and work.is_completed()
    sync_gathered, sync_scattered, sync_reduced = (
        torch.empty_like(gathered),
        torch.empty_like(scattered),
        inp.clone(),
    )
    cp.all_gather_into_tensor(sync_gathered, inp, codec="int8")
    cp.reduce_scatter_tensor(sync_scattered, inp, codec="int8")
    cp.all_reduce(sync_reduced, codec="int8", algorithm="alltoall")
    return [
        torch.equal(a, b)
        for a, b in (
            (gathered, sync_gathered),
            (scattered, sync_scattered),
            (reduced, sync_reduced),
        )
    ]


def _native_after_async(rank, world_size):
    from commpress.collectives.work import launch

    if rank == 1:  # this rank's communication thread starts the compressed call late
        launch(lambda: time.sleep(0.5), async_op=True)
    gathered = torch.empty(1_000 * world_size)
    work = cp.all_gather_into_tensor(
        gathered, torch.full((1_000,), float(rank)), codec="none", algorithm="backend",
        async_op=True,
    )  # fmt: skip
    if rank == 0:  # while rank 0's has reached gloo already
        time.sleep(0.1)
    results = []
    for op in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"):
        out = torch.empty(world_size if op == "all_gather_into_tensor" else 1)
        inp = torch.full((1 if op == "all_gather_into_tensor" else world_size,), rank + 1.0)
        if op == "all_reduce":
            cp.all_reduce(out.fill_(rank + 1.0), algorithm="native")
        else:
            getattr(cp, op)(out, inp, algorithm="native")
        results.append(out.tolist())
        if op == "all_reduce":  # and a compressed call queued again before the next
            work.wait()
            work = cp.reduce_scatter_tensor(
                torch.empty(1), torch.ones(world_size), codec="none", async_op=True
            )
    work.wait()
    return gathered.tolist(), results


def test_native_runs_after_the_compressed_calls_given_before_it():
    """``native`` runs torch's collective on the calling thread at once; before, a
    compressed call given before it could still be queued on one rank's communication
    thread while its peer had started it, and gloo ended the process on the mismatch."""
    for gathered, results in run_distributed(_native_after_async, 2):
        assert gathered == [0.0] * 1_000 + [1.0] * 1_000
        assert results == [[3.0], [3.0], [1.0, 2.0]]


def _two_natives_behind_a_compressed_call(rank, world_size):
    from commpress.collectives.work import launch

    compressed = cp.all_reduce(torch.ones(8), codec="int8", algorithm="alltoall", async_op=True)
    if rank == 0:  # this rank's communication thread busy with something else meanwhile
        launch(lambda: time.sleep(1.0), async_op=True)
    first, second = torch.ones(4), torch.full((4,), 10.0)
    first_work = cp.all_reduce(first, algorithm="native", async_op=True)
    if rank == 0:
        time.sleep(0.5)
    second_work = cp.all_reduce(second, algorithm="native", async_op=True)
    for work in (compressed, first_work, second_work):
        work.wait()
    return first.tolist(), second.tolist()


def test_two_native_calls_behind_a_compressed_one_keep_their_order():
    """A native call queued behind a compressed one was not remembered as queued: the next
    native call, issued at once on the caller's thread, reached gloo before the first on
    one rank and after it on the other, and the two all-reduces were paired crosswise
    without an error (11 and 11 for 2 and 20)."""
    for first, second in run_distributed(_two_natives_behind_a_compressed_call, 2):
        assert first == [2.0] * 4 and second == [20.0] * 4, (first, second)


def test_async_handles_give_the_same_results_as_synchronous_calls():
    for flags in run_distributed(_async_equals_sync, 4):
        assert flags == [True, True, True]


def _workspace_released_while_a_call_runs(rank, world_size):
    """Rank 1 joins late, so rank 0's int8 all-gather is still on its communication thread
    (its encode in workspace buffers) when rank 0 asks to free them."""
    inp = torch.full((100_000,), float(rank + 1))
    out = torch.empty(100_000 * world_size)
    if rank == 1:
        time.sleep(1.0)
    work = cp.all_gather_into_tensor(out, inp, codec="int8", async_op=True)
    refused = None
    if rank == 0:
        try:
            cp.release_workspace()
        except RuntimeError as error:
            refused = str(error)
    work.wait()
    freed = cp.release_workspace()
    if rank == 1:  # so that rank 0's call is still running when its callback is attached
        time.sleep(1.0)
    in_callback = cp.all_gather_into_tensor(out, inp, codec="int8", async_op=True).get_future()
    from_callback = in_callback.then(_release_in_a_callback).wait()
    return refused, freed, out[::100_000].tolist(), from_callback


def _release_in_a_callback(future) -> str:
    try:
        return f"freed {cp.release_workspace()}"
    except RuntimeError as error:
        return str(error)


def test_the_workspace_is_not_freed_under_a_running_collective():
    """``release_workspace()`` freed the buffers of a collective still running (its
    docstring alone said not to); now it refuses, and frees once the call has finished; in
    a callback of a commpress future, on the communication thread, it is refused too."""
    outcomes = run_distributed(_workspace_released_while_a_call_runs, 2, timeout=60)
    (refused, freed, gathered, _), (_, other_freed, other, _) = outcomes
    assert refused is not None and "1 commpress collective queued or running" in refused
    assert freed > 0 and other_freed > 0
    assert gathered == other == [1.0, 2.0]
    # rank 0's callback runs on the communication thread (a callback attached to a call
    # already finished runs on the caller's, where it frees): it waited on itself, for good
    assert "cannot be called on commpress's communication thread" in outcomes[0][3]


def _queued_across_a_new_world(rank, world_size, store_path):
    from commpress.collectives.work import launch

    before = torch.full((8,), 100.0)
    if rank == 0:  # given to the first world, still queued when it is destroyed
        launch(lambda: time.sleep(0.5), async_op=True)
        work = cp.all_reduce(before, codec="none", async_op=True)
    dist.destroy_process_group()
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    after = torch.full((8,), rank + 1.0)
    cp.all_reduce(after, codec="none", timeout=timedelta(seconds=10))
    if rank == 0:
        with pytest.raises(RuntimeError, match=r"all_reduce \(none@ring\) did not run: its pr"):
            work.wait()
    return after[0].item(), before[0].item()


def test_a_call_on_a_destroyed_world_does_not_run_on_the_next_one(tmp_path):
    """A call given with ``group=None`` found the default group when it ran, not when it
    was given: one still queued when the world was destroyed ran on the world initialised
    after, against a peer's next call (whose result it summed into, 102 for 3), and that
    rank's own next call then failed."""
    store = str(tmp_path / "second-world")
    assert run_distributed(_queued_across_a_new_world, 2, store) == [(3.0, 100.0)] * 2


def _group_destroyed(rank, world_size, queued):
    """Rank 0 destroys the group of its all-reduce before the call runs (queued behind a
    wait) or between its reduce-scatter and its all-gather; what rank 0's call raised."""
    from commpress.collectives.work import launch

    all_reduce = importlib.import_module("commpress.collectives.all_reduce")  # the module

    group = dist.new_group([0, 1])
    tensor = torch.ones(1_000)
    timeout = timedelta(seconds=2)
    if rank == 1:
        if not queued:  # its all-gather loses rank 0's connection (or waits for it in vain)
            with pytest.raises(RuntimeError, match="commpress all_reduce"):
                cp.all_reduce(tensor, group=group, timeout=timeout)
        return None
    reached, destroyed = threading.Event(), threading.Event()
    if queued:
        launch(destroyed.wait, async_op=True)
        reached.set()
    else:
        reduce_scattered = all_reduce.gather

        def gather(*args):
            reached.set()
            destroyed.wait()
            return reduce_scattered(*args)

        all_reduce.gather = gather
    work = cp.all_reduce(tensor, group=group, timeout=timeout, async_op=True)
    reached.wait()
    dist.destroy_process_group(group)
    destroyed.set()
    try:
        work.wait()
    except Exception as error:  # noqa: BLE001 - reported to the test
        return type(error).__name__, str(error)
    return None


@pytest.mark.parametrize("queued", [True, False])
def test_a_call_whose_group_is_destroyed_says_so(queued):
    """A call whose group was destroyed raised torch's 'Group ... is not registered'
    (queued: from reading the group's rank for the failure's message; running: from its
    next step), or its 'Invariant encountered: value was None', naming neither the call
    nor what happened."""
    kind, message = run_distributed(_group_destroyed, 2, queued, timeout=60)[0]
    assert kind == "RuntimeError"
    running = "on a group of 2 ranks (this is rank 0) failed after"
    when = "did not run" if queued else running
    assert message.startswith(f"commpress all_reduce (int8@ring) {when}"), message
    assert "its process group was destroyed (torch.distributed.destroy_process_group)" in message


STALL_SECONDS = 15.0  # the longest the stalled peer stays away
TIMEOUT = timedelta(seconds=3)


def _one_rank_stalls(rank, world_size, algorithm, op, directory):
    if rank == 1:  # never joins the collective, until the others have given up on it
        stall(directory, (0, 2), STALL_SECONDS)
        return None
    inp = torch.randn(4096)

    def call():
        if op == "all_gather":
            out = torch.empty(4096 * world_size)
            cp.all_gather_into_tensor(out, inp, algorithm=algorithm, timeout=TIMEOUT)
        else:
            out = torch.empty(4096 // world_size)
            cp.reduce_scatter_tensor(
                out, inp[: out.numel() * world_size], algorithm=algorithm, timeout=TIMEOUT
            )

    return timed_outcome(call, directory, rank)


@pytest.mark.parametrize(
    ("algorithm", "op"),
    [
        ("ring", "all_gather"),
        ("backend", "all_gather"),
        ("multicast", "all_gather"),  # its channel's set-up, the first call's first step
        ("ring", "reduce_scatter"),
        ("alltoall", "reduce_scatter"),
    ],
)
def test_a_stalled_peer_raises_within_the_timeout_on_every_other_rank(algorithm, op, tmp_path):
    """A RuntimeError that names the collective and its timeout (it was the backend's bare
    "Timed out waiting 3000ms for recv operation to complete")."""
    results = run_distributed(_one_rank_stalls, 3, algorithm, op, str(tmp_path), timeout=90)
    name = "all_gather_into_tensor" if op == "all_gather" else "reduce_scatter_tensor"
    for rank in (0, 2):
        kind, message, elapsed = results[rank]
        assert kind == "CollectiveTimeoutError", (algorithm, op, rank, kind, message)
        assert message.startswith(
            f"commpress {name} (int8@{algorithm}) on a group of 3 ranks (this is rank {rank}) "
            "timed out after 3."
        ), message
        assert "(timeout=0:00:03)" in message and "The backend said: " in message
        # Not at once (an unrelated error would be), and not once the stalled peer is back.
        low = TIMEOUT.total_seconds() - 0.5
        assert low < elapsed < STALL_SECONDS - 2, (algorithm, op, rank, elapsed, message)


def _a_subgroup_peer_stalls_past_the_groups_timeout(rank, world_size, algorithm):
    """Global rank 2 stalls on the group of global ranks 1 and 2 (timeout 1 s); what the
    call of global rank 1, given no timeout, raised."""
    group = dist.new_group([1, 2], timeout=timedelta(seconds=1))
    if rank != 1:
        time.sleep(3)
        return None
    try:
        cp.all_reduce(torch.ones(12), group=group, algorithm=algorithm)
    except RuntimeError as error:
        return type(error).__name__, str(error)
    return None


@pytest.mark.parametrize("algorithm", ["backend", "alltoall"])
def test_the_groups_own_timeout_is_a_collective_timeout_error(algorithm):
    """On the group's timeout gloo told the other transfers of the connection that timed
    out "Application timeout caused pair closure", which was taken for another failure: a
    plain RuntimeError ("failed after 1.0 s"), not the CollectiveTimeoutError promised. (Its
    message says the connection was closed by a timeout, since gloo says the same to a
    later call on that connection, at once.)"""
    results = run_distributed(_a_subgroup_peer_stalls_past_the_groups_timeout, 3, algorithm)
    kind, message = results[1]
    assert kind == "CollectiveTimeoutError", message
    # which of the call's transfers gloo reports first, the one that timed out or another
    # on its connection, varies from run to run: either is this call's timeout, named
    timed_out = "(this is rank 0, global rank 1) timed out after 1."
    closed = "(this is rank 0, global rank 1) failed after 1."
    if timed_out in message:
        assert "(the process group's timeout)" in message, message
    else:
        assert closed in message, message
        assert "closed by a timeout, this call's (the process group's timeout)" in message


def _one_rank_dies(rank, world_size):
    inp = torch.randn(1 << 16)
    out = torch.empty(inp.numel() * world_size)
    if rank == 1:
        os._exit(3)  # dies without a word, like a crashed process
    start = time.monotonic()
    try:
        cp.all_gather_into_tensor(out, inp, timeout=timedelta(seconds=20))
    except Exception as error:
        return type(error).__name__, str(error), time.monotonic() - start
    return "no error", "", time.monotonic() - start


def test_a_dead_peer_raises_on_every_other_rank():
    """A RuntimeError that names the collective (it was gloo's bare "Connection closed by
    peer")."""
    results = run_distributed(_one_rank_dies, 3, timeout=90, allow_dead=True)
    assert results[1] is None
    for rank in (0, 2):
        kind, message, elapsed = results[rank]
        assert kind == "RuntimeError" and elapsed < 25, (rank, kind, elapsed)
        assert message.startswith(
            f"commpress all_gather_into_tensor (int8@ring) on a group of 3 ranks (this is rank "
            f"{rank}) failed after "
        ), message


def _under_inference_mode(rank, world_size):
    """Each op on tensors made under inference mode, against torch's on the same inputs
    (integers: exact with `none`), then a call outside it."""
    with torch.inference_mode():
        shard = torch.arange(6, dtype=torch.float32) + 10 * rank
        whole = torch.arange(6 * world_size, dtype=torch.float32) * (rank + 1)
        gathered, expected = torch.empty(6 * world_size), torch.empty(6 * world_size)
        cp.all_gather_into_tensor(gathered, shard, codec="none")
        dist.all_gather_into_tensor(expected, shard)
        reduced, reference = torch.empty(6), torch.empty(6)
        cp.reduce_scatter_tensor(reduced, whole, codec="none")
        dist.reduce_scatter_tensor(reference, whole)
        summed = whole.clone()
        cp.all_reduce(summed, codec="none")
        total = whole.clone()
        dist.all_reduce(total)
    after = torch.empty(6 * world_size)
    cp.all_gather_into_tensor(after, torch.arange(6, dtype=torch.float32), codec="none")
    same = torch.equal(gathered, expected) and torch.equal(reduced, reference)
    return same and torch.equal(summed, total), after.tolist()


def test_tensors_made_under_inference_mode_are_written_as_torch_writes_them():
    """The communication thread is not under the caller's inference mode: every op raised
    "Inplace update to inference tensor outside InferenceMode" after communicating."""
    for same, after in run_distributed(_under_inference_mode, 2, timeout=120):
        assert same and after == list(range(6)) * 2


def _multicast_setup_with_a_stalled_peer(rank, world_size, directory):
    from commpress.transport import multicast

    if rank == 1:
        stall(directory, (0, 2), STALL_SECONDS)
        return None
    return timed_outcome(lambda: multicast.channel_for(None, TIMEOUT), directory, rank)


def test_a_multicast_channel_set_up_gives_up_within_the_call_timeout(tmp_path):
    """The set-up's exchanges of addresses waited for the process group's timeout (30
    minutes by default), whatever the call's ``timeout``."""
    results = run_distributed(_multicast_setup_with_a_stalled_peer, 3, str(tmp_path), timeout=60)
    for _, message, elapsed in (results[0], results[2]):
        assert "timed out" in message.lower(), message
        assert TIMEOUT.total_seconds() - 0.5 < elapsed < STALL_SECONDS - 2, (elapsed, message)


def _objects_of_every_rank(rank, world_size):
    from commpress.transport.objects import all_gather_objects

    mine = {"rank": rank, "text": "x" * (100 * rank), "none": None}  # of different lengths
    return all_gather_objects(mine, None, TIMEOUT)


def test_the_timed_object_exchange_gives_every_rank_every_object_in_rank_order():
    expected = [{"rank": r, "text": "x" * (100 * r), "none": None} for r in range(3)]
    assert run_distributed(_objects_of_every_rank, 3) == [expected] * 3


def _objects_around_the_ring(rank, world_size):
    from commpress.transport.objects import ring_gather_objects

    return ring_gather_objects(_ring_object(rank), None, TIMEOUT)


def _ring_object(rank):
    """Of different sizes: a small one, an empty one, one of about 1 MB, and others."""
    if rank == 1:
        return b""
    if rank == 2:
        return bytes(range(256)) * 4096  # 1 MiB
    return {"rank": rank, "text": "x" * (100 * rank), "none": None}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_ring_object_exchange_gives_every_rank_every_object_in_rank_order(world_size):
    expected = [_ring_object(r) for r in range(world_size)]
    assert run_distributed(_objects_around_the_ring, world_size) == [expected] * world_size


def _ring_exchange_with_a_stalled_peer(rank, world_size, directory):
    from commpress.transport.objects import ring_gather_objects

    if rank == 1:
        stall(directory, (0, 2), STALL_SECONDS)
        return None
    return timed_outcome(lambda: ring_gather_objects(rank, None, TIMEOUT), directory, rank)


def test_the_ring_object_exchange_gives_up_on_a_peer_that_never_calls_it(tmp_path):
    """Rank 0 waits on its send to the stalled rank, rank 2 on its receive from it."""
    results = run_distributed(_ring_exchange_with_a_stalled_peer, 3, str(tmp_path), timeout=60)
    for kind, message, elapsed in (results[0], results[2]):
        assert kind in ("RuntimeError", "DistBackendError"), (kind, message)
        assert "timed out" in message.lower(), message
        assert TIMEOUT.total_seconds() - 0.5 < elapsed < STALL_SECONDS - 2, (elapsed, message)


def _post_late(fraction: float) -> None:
    """This rank posts each of its point-to-point messages ``fraction`` of the timeout late."""
    from commpress.transport import p2p

    post_each = p2p.post_each

    def late(*args):
        time.sleep(fraction * TIMEOUT.total_seconds())
        return post_each(*args)

    p2p.post_each = late


def _ring_exchange_with_a_slow_peer(rank, world_size):
    """Rank 2 posts each of its messages 0.6 of the timeout late: every wait of its peers
    is shorter than the timeout, the exchange longer."""
    from commpress.transport.objects import ring_gather_objects

    if rank == 2:
        _post_late(0.6)
    return outcome(lambda: ring_gather_objects(rank, None, TIMEOUT))


def test_the_ring_object_exchange_keeps_within_one_timeout_in_all():
    """Each of its 2(n - 1) waits was given the whole timeout: a peer slow at every step, but
    never a timeout late, made it take 2.4 timeouts without a word."""
    results = run_distributed(_ring_exchange_with_a_slow_peer, 3, timeout=60)
    for kind, message, _ in results[:2]:
        assert kind in ("RuntimeError", "DistBackendError"), (kind, message, results)
        assert "timed out" in message.lower(), message


def _all_gather_with_a_slow_peer(rank, world_size, late, groups_own=False):
    """Rank 2 posts each of its messages ``late`` of the timeout late: each wait of its
    peers is shorter than the timeout, the call longer. ``groups_own``: the call is given
    no timeout, on a group made with it."""
    group = dist.new_group(list(range(world_size)), timeout=TIMEOUT) if groups_own else None
    timeout = None if groups_own else TIMEOUT
    if rank == 2:
        _post_late(late)
    out = torch.empty(1000 * world_size)
    return outcome(
        lambda: cp.all_gather_into_tensor(
            out, torch.ones(1000), group, codec="int8", timeout=timeout
        )  # fmt: skip
    )


def test_a_collective_keeps_within_one_timeout_in_all():
    """Its waits share the timeout, as torch's collective is bounded as a whole: a peer
    late at every step, never a timeout late, must not stretch the call past it. (Each
    wait given the whole timeout, the call took 4.8 s against a timeout of 3 without a
    word.)"""
    results = run_distributed(_all_gather_with_a_slow_peer, 3, 0.4, timeout=60)
    for kind, message, elapsed in results[:2]:
        assert kind == "CollectiveTimeoutError", (kind, message, results)
        assert elapsed < 1.5 * TIMEOUT.total_seconds(), (elapsed, message)


def test_a_collective_given_no_timeout_keeps_within_the_groups_in_all():
    """The default timeout is the group's, and bounds the whole call too. (Given none, each
    wait took the group's whole timeout: the call took 4.8 s on a group of 3 s without a
    word.)"""
    results = run_distributed(_all_gather_with_a_slow_peer, 3, 0.4, True, timeout=60)
    for kind, message, elapsed in results[:2]:
        assert kind == "CollectiveTimeoutError", (kind, message, results)
        assert "the process group's timeout" in message, message
        assert elapsed < 1.5 * TIMEOUT.total_seconds(), (elapsed, message)


def _all_reduce_with_a_slow_peer(rank, world_size, late):
    """Rank 2 starts each half of the all-reduce (its reduce-scatter, then its all-gather)
    ``late`` of the timeout late: each half of its peers' call is shorter than the timeout,
    the whole call longer."""
    from commpress.collectives import all_gather, reduce_scatter

    if rank == 2:
        for module in (reduce_scatter, all_gather):

            def started_late(*args, _execute=module.execute, **kwargs):
                time.sleep(late * TIMEOUT.total_seconds())
                return _execute(*args, **kwargs)

            module.execute = started_late
    return outcome(lambda: cp.all_reduce(torch.ones(3000), codec="int8", timeout=TIMEOUT))


def test_an_all_reduce_keeps_within_one_timeout_in_all():
    """Its reduce-scatter and its all-gather share the timeout too. (Each given a timeout of
    its own, a peer late at each by 0.7 of it stretched a 3 s call to 4.3 s without a
    word.)"""
    results = run_distributed(_all_reduce_with_a_slow_peer, 3, 0.7, timeout=60)
    for kind, message, elapsed in results[:2]:
        assert kind == "CollectiveTimeoutError", (kind, message, results)
        assert message.startswith("commpress all_reduce (int8@ring)"), message
        assert elapsed < 1.3 * TIMEOUT.total_seconds(), (elapsed, message)


def _ring_exchange_against_a_collective(rank, world_size, directory):
    from commpress.transport.objects import ring_gather_objects

    if rank == 0:
        call = lambda: ring_gather_objects(rank, None, TIMEOUT)  # noqa: E731
    else:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=6), None)
        call = lambda: dist.all_gather_into_tensor(torch.empty(8), torch.ones(4))  # noqa: E731
    return timed_outcome(call, directory, rank)


def test_the_ring_object_exchange_never_meets_a_peers_collective(tmp_path):
    """Two all-gathers (all_gather_objects) against a peer's all-gather of other sizes:
    gloo ends the process (``op.preamble.length <= op.nbytes``). Messages of a tag of
    their own are never matched with a collective: both sides time out."""
    results = run_distributed(_ring_exchange_against_a_collective, 2, str(tmp_path), timeout=60)
    kind, message, elapsed = results[0]
    assert "timed out" in message.lower(), (kind, message)
    assert TIMEOUT.total_seconds() - 0.5 < elapsed < STALL_SECONDS - 2, (elapsed, message)
    assert results[1][0] != "no error", results[1]


def _ring_exchange_against_a_compressed_collective(rank, world_size, directory, tag):
    from commpress.transport.objects import ring_gather_objects

    if rank == 0:
        call = lambda: ring_gather_objects(rank, None, TIMEOUT, tag)  # noqa: E731
    else:  # its in-band check's first message, header and shard, goes to rank 0
        out, shard = torch.empty(2 * 4096), torch.ones(4096)
        call = lambda: cp.all_gather_into_tensor(out, shard, algorithm="ring", timeout=TIMEOUT)  # noqa: E731
    return timed_outcome(call, directory, rank)


def test_the_ring_object_exchange_never_meets_a_peers_compressed_collective(tmp_path):
    """An exchange on the tag of the compressed collectives' own point-to-point messages
    (0 when this was written; ``p2p.COLLECTIVES_TAG`` since) took a peer's first message (a
    header and a shard, some kilobytes) into its 8-byte length, and gloo ended the process
    (tried with that tag: "rank 0 died"). On a tag of its own, the exchange times out."""
    from commpress.transport.objects import SET_UP_TAG

    function = _ring_exchange_against_a_compressed_collective
    results = run_distributed(function, 2, str(tmp_path), SET_UP_TAG, timeout=60)
    kind, message, _ = results[0]
    assert "timed out" in message.lower(), (kind, message)
    assert results[1][0] != "no error", results[1]  # timed out, or saw rank 0 leave first


def _first_tuned_call_with_a_stalled_peer(rank, world_size, directory):
    from commpress.sim import tuner

    if rank == 1:
        stall(directory, (0, 2), STALL_SECONDS)
        return None
    tuner.configure(link="1gbit", algorithms=("native", "ring"))
    out, inp = torch.empty(64 * world_size), torch.ones(64)
    call = lambda: cp.all_gather_into_tensor(out, inp, algorithm="auto", timeout=TIMEOUT)  # noqa: E731
    return timed_outcome(call, directory, rank)


def test_a_first_tuned_call_gives_up_within_its_timeout(tmp_path):
    """The tuner's exchange of its choice, the first call's first communication, waited
    for the process group's timeout (30 minutes by default), whatever the call's."""
    results = run_distributed(_first_tuned_call_with_a_stalled_peer, 3, str(tmp_path), timeout=60)
    for kind, message, elapsed in (results[0], results[2]):
        assert kind == "CollectiveTimeoutError", (kind, message)
        assert message.startswith("commpress all_gather_into_tensor (int8@auto) on a group of 3")
        assert TIMEOUT.total_seconds() - 0.5 < elapsed < STALL_SECONDS - 2, (elapsed, message)


_PENDING_AT_EXIT = r"""
import sys, time
from datetime import timedelta
import torch, torch.distributed as dist
import commpress as cp
from commpress.transport import collective

rank, store, how = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
state, hook = cp.ddp.hook("none@native", timeout=timedelta(seconds=1))
if rank == 1:
    time.sleep(6)  # never joins the all-reduce
    sys.exit(0)
if how == "hook":
    class Bucket:
        def buffer(self):
            return torch.ones(4)

    future = hook(state, Bucket())
else:
    collective.all_reduce(torch.ones(4), dist.ReduceOp.SUM, state.group)


class _Late:
    def __del__(self):
        time.sleep(2)  # the interpreter is finalizing when the all-reduce times out


late = _Late()
"""


@pytest.mark.parametrize("how", ["collective", "hook"])
def test_a_collective_on_an_owned_group_pending_at_exit_does_not_abort_the_process(how, tmp_path):
    """Each collective of torch's on a group commpress owns (a hook's, a twin) had a Python
    callback on its future; one still pending when the interpreter exited (a peer stalled,
    and this rank gave up after the same timeout) failed on gloo's thread during
    finalization, whose taking of the GIL ended that thread through C++ code: "terminate
    called after throwing an instance of 'gloo::IoException'", SIGABRT, a core dump. So did
    the callback of a ``none@native`` DDP hook on its all-reduce's future."""
    import subprocess
    import sys

    store = str(tmp_path / "store")
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _PENDING_AT_EXIT, str(rank), store, how],
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        _, errors = ranks[0].communicate(timeout=60)
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert ranks[0].returncode == 0, errors[-2000:]


def _native_with_a_stalled_peer(rank, world_size, op, directory):
    timeout = timedelta(seconds=2)
    # gloo's reduce-scatter Work ignores wait(timeout): only its group's timeout bounds it
    group = dist.new_group([0, 1], timeout=timeout)
    if rank == 1:
        stall(directory, (0,), STALL_SECONDS)
        return None
    options = {"algorithm": "native", "group": group, "timeout": timeout}
    if op == "all_reduce":
        call = lambda: cp.all_reduce(torch.ones(8), **options)  # noqa: E731
    else:
        n = 8 * world_size
        out, inp = (
            (torch.empty(n), torch.ones(8))
            if op == "all_gather"
            else (torch.empty(8), torch.ones(n))
        )
        function = cp.all_gather_into_tensor if op == "all_gather" else cp.reduce_scatter_tensor
        call = lambda: function(out, inp, **options)  # noqa: E731
    return timed_outcome(call, directory, rank)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
def test_a_native_collective_that_times_out_names_itself(op, tmp_path):
    """``algorithm="native"`` raised torch's bare error ("Operation timed out!"), not the
    ``CollectiveTimeoutError`` naming the collective that every other algorithm raises."""
    kind, message, elapsed = run_distributed(
        _native_with_a_stalled_peer, 2, op, str(tmp_path), timeout=60
    )[0]
    assert kind == "CollectiveTimeoutError", message
    name = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}
    assert message.startswith(
        f"commpress {name.get(op, op)} (none@native) on a group of 2 ranks (this is rank 0) "
        "timed out after 2."
    ), message
    assert 1.5 < elapsed < 8, (elapsed, message)


def _a_peer_late_within_the_call_timeout_but_past_the_groups(rank, world_size, algorithm, path):
    """The group's timeout is 1 s, the call's 8 s; global rank 1 stays away up to 8 s."""
    group = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    if rank == 1:
        stall(path, (0,), STALL_SECONDS)
        return None
    call = lambda: cp.all_reduce(  # noqa: E731
        torch.ones(8), group=group, algorithm=algorithm, timeout=timedelta(seconds=8)
    )
    return timed_outcome(call, path, rank)


@pytest.mark.parametrize("algorithm", ["native", "alltoall"])
def test_a_timeout_longer_than_the_groups_names_the_groups_when_that_ran_out(algorithm, tmp_path):
    """gloo's collectives end at their group's timeout whatever ``timeout=`` is: the call
    gave up after 1 s and said "timed out after 1.0 s (timeout=0:00:08)"."""
    kind, message, elapsed = run_distributed(
        _a_peer_late_within_the_call_timeout_but_past_the_groups, 2, algorithm, str(tmp_path)
    )[0]
    assert kind == "CollectiveTimeoutError" and elapsed < 6, (elapsed, message)
    assert "(timeout=0:00:08)" not in message, message
    assert (
        "the process group's own timeout, 0:00:01, which timeout=0:00:08 cannot lengthen for "
        "the backend's collectives: make the group with a longer one"
    ) in message, message


def _in_a_forked_child(rank, world_size, algorithm):
    """Rank forks after its first compressed call; the child calls one on the group it
    inherited (the world) with a 2 s timeout and writes what happened to a pipe. What the
    child said (None: it hung and was killed), then the parent's next call's result."""
    import signal

    cp.all_reduce(torch.ones(4), codec="int8")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            if algorithm == "ddp.hook":  # its set-up's exchange over the world
                cp.ddp.hook("int8", timeout=timedelta(seconds=2))
            else:
                cp.all_reduce(torch.ones(4), algorithm=algorithm, timeout=timedelta(seconds=2))
            said = "ran"
        except Exception as error:  # noqa: BLE001 - reported to the test
            said = f"{type(error).__name__}: {error}"
        os.write(write, said.encode()[:4000])
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and os.waitpid(child, os.WNOHANG) == (0, 0):
        time.sleep(0.05)
    else:
        if time.monotonic() >= deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
    said = os.read(read, 4000).decode() or None
    os.close(read)
    after = torch.full((4,), rank + 1.0)
    cp.all_reduce(after, codec="int8")
    return said, after.tolist()


@pytest.mark.parametrize("algorithm", ["ring", "alltoall", "ddp.hook"])
def test_a_group_inherited_through_a_fork_is_refused_in_the_child(algorithm):
    """A process forked after init_process_group inherits its groups, but not gloo's
    threads that move their data: a compressed call there on such a group hung for good,
    past its timeout (in gloo, which waits for its dead event loop to drop a connection
    that timed out), where torch's own collective raises its timeout. The child's call is
    refused at once, naming the parent; the parent goes on."""
    for said, after in run_distributed(_in_a_forked_child, 2, algorithm, timeout=60):
        assert said is not None, "the child's call hung"
        call = "ddp.hook" if algorithm == "ddp.hook" else f"all_reduce (int8@{algorithm})"
        assert said.startswith(f"RuntimeError: commpress {call} did not run: "), said
        assert "made by process" in said and "before it forked this one" in said, said
        assert after == [3.0] * 4
