"""commpress's own process groups beside the ones FSDP2 hands its custom collectives.

Compressed collectives run on commpress's communication thread, while FSDP2 issues
torch's own collectives (a reduce-scatter left uncompressed, say) from the training
thread: on one process group their order could differ between ranks, which hangs
NCCL. So each of FSDP's groups gets a twin with the same ranks, created once by
``cp.fsdp.compress``, and only commpress's traffic uses the twins.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress import _torch_private
from commpress.collectives.failures import named_as, refuse_inherited
from commpress.collectives.work import in_queue_order
from commpress.ranks import this_rank
from commpress.transport import backends, owned_groups, p2p
from commpress.transport.objects import all_gather_objects, ring_gather_objects
from commpress.units import counted


def exchange_with_every_rank(mine: object, timeout: timedelta | None, caller: str) -> list:
    """Every rank's ``mine``, exchanged over the world by ``caller`` before it sets anything
    up, after the compressed collectives given before it (on one rank it could otherwise
    reach the backend before one of them, on another after), on the caller's GPU where the
    world moves CUDA tensors; a peer that does not call it within ``timeout`` (None: the
    world's) makes it raise, naming ``caller`` and saying that every rank must call it.

    Where the world moves CPU tensors by a backend other than NCCL (gloo), the exchange
    goes around the ring by point-to-point messages of a tag of its own
    (:func:`~commpress.transport.objects.ring_gather_objects`), which gloo never matches
    with a collective: a peer that runs one on the world meanwhile (``caller`` called on
    one rank alone, its peer training with FSDP2's own all-gathers) makes it time out, where
    two all-gathers would meet that collective and gloo end the process on the size
    mismatch. On an NCCL-only world it stays :func:`all_gather_objects` on the GPU (NCCL
    matches point-to-point messages by order, not tag): against such a peer the two may
    still meet there."""
    return _exchange_made(lambda: mine, timeout, caller)


def _exchange_made(make_mine: Callable[[], object], timeout: timedelta | None, caller: str):
    """:func:`exchange_with_every_rank` of ``make_mine()``, made once the compressed
    collectives given before have run."""
    refuse_inherited(caller, None)
    this = this_rank(dist.get_rank(), None)
    exchanged = []
    # the world moves CPU tensors (gloo): no GPU; else (NCCL alone) the caller's current one
    on_gpu = not backends.moves(None, "cpu")
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None

    around_the_ring = p2p.sends_may_go_alone(None)

    def exchange() -> None:
        if around_the_ring:
            exchanged.extend(ring_gather_objects(make_mine(), None, timeout))
        else:
            exchanged.extend(all_gather_objects(make_mine(), None, timeout))

    with named_as(
        f"{caller} on {counted(dist.get_world_size(), 'rank')} (this is {this})",
        timeout,
        cause=f"every rank must call {caller}, and a peer did not (or stalled, or died)",
    ):
        in_queue_order(exchange, device)
    return exchanged


def standing_in_for(group: dist.ProcessGroup | None, timeout: timedelta | None) -> timedelta:
    """The timeout of a group commpress makes in place of ``group`` (None: the world):
    ``timeout``, or for None ``group``'s own (``new_group``'s default is torch's 30 minutes,
    whatever ``init_process_group`` or ``group`` was given)."""
    if timeout is not None:
        return timeout
    return _torch_private.group_timeout(backends.or_world(group))


def own_groups(
    owner: object, requests: list, caller: str, timeout: timedelta | None = None
) -> list:
    """:mod:`commpress.transport.owned_groups`' group for each of ``requests``, agreed by
    one exchange over the world (:func:`exchange_with_every_rank`). The offers are made
    there, once the compressed collectives given before have run: one abandoned on this rank
    alone (its owner gone) has failed by then, and its group is offered no more."""
    everyone = _exchange_made(lambda: (requests, owned_groups.offers(requests)), timeout, caller)
    return owned_groups.take(owner, requests, everyone)


def _ranks(group: dist.ProcessGroup) -> tuple[int, ...]:
    return tuple(dist.get_process_group_ranks(group))


class OwnGroups:
    """A twin of every process group in ``groups``, created collectively on every rank.

    Ranks may hold different groups (the shard groups of HSDP): every rank publishes the
    rank lists of its own, and every rank then creates the twins of all of them in one
    agreed order, as ``new_group`` requires.
    """

    def __init__(self, groups: list[dist.ProcessGroup], timeout: timedelta | None = None):
        mine = {(_ranks(g), dist.get_backend(g), standing_in_for(g, timeout)) for g in groups}
        published = exchange_with_every_rank(sorted(mine), timeout, "fsdp.compress")
        everyone = sorted({group for groups_of_rank in published for group in groups_of_rank})
        requests = [("fsdp twin", *group) for group in everyone]
        twins = own_groups(self, requests, "fsdp.compress", timeout)
        self._twins: dict[tuple[tuple[int, ...], str], dist.ProcessGroup] = {
            (ranks, backend): twin
            for (ranks, backend, _), twin in zip(everyone, twins, strict=True)
            if dist.get_rank() in ranks
        }

    def for_call(
        self, group: dist.ProcessGroup, algorithm: str, tensor: torch.Tensor
    ) -> dist.ProcessGroup:
        """Where a collective FSDP hands over runs: the twin of ``group``, but ``native`` on
        CUDA stays on FSDP's own group (issued at once on the training thread, in FSDP's
        order), since no ``timeout`` reaches torch's NCCL collective there, and the twin's
        communicator would be made for it alone."""
        if algorithm == "native" and tensor.is_cuda:
            return group
        return self.twin(group)

    def twin(self, group: dist.ProcessGroup) -> dist.ProcessGroup:
        """commpress's twin of FSDP's ``group``, where every collective of commpress's runs,
        ``native`` too: torch's collective then waits for the twin's timeout (``compress``'s
        ``timeout``), not FSDP's group's, and runs after the compressed ones given to the
        twin before it (:func:`~commpress.collectives.work.run_native`)."""
        ranks = tuple(dist.get_process_group_ranks(group))
        twin = self._twins.get((ranks, dist.get_backend(group)))
        if twin is None:
            raise RuntimeError(
                f"FSDP handed commpress a process group of ranks {list(ranks)} that its "
                "modules did not have when cp.fsdp.compress ran; call compress after "
                "fully_shard and do not change the device mesh afterwards"
            )
        return twin
