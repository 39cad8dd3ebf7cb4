"""``algorithm="auto"`` and ``codec="auto:..."`` resolved for one call by the tuner
(:mod:`commpress.sim.tuner`), after the checks that need no algorithm (the tensors, a
residual, the device) and before those of the one chosen. A codec given with
``algorithm="auto"``, and one of an auto codec's candidates at least, must take the input's
dtype, as the tuner says in the exchange below, unless only torch's collective, which
ignores the codec, may run the call (a reduction of float64 or integers).

On a group's first call of each shape every rank's choice is exchanged over the group, in
the order of the communication thread's queue (behind the compressed collectives given
before it): ranks that chose differently would run different collectives, and a
``native`` one unchecked, so then every rank raises, naming the settings that differ (as
every rank does where one could not choose). The agreed choice is kept per group and
call (of the :data:`KEPT_CHOICES` most recently used), whatever a rank's environment says,
until the tuner or the group's multicast options are set to other values
(:func:`commpress.sim.tuner.configure`, :func:`commpress.transport.multicast.configure`,
on every rank of the group; compared by value): whether a call exchanges must not depend
on what one rank alone was told.

A rank that has kept a choice runs its collective at once, while a peer whose call differs
(another shape, not kept) exchanges: so the exchange opens as a checked collective does
(:class:`~commpress.collectives.inband.Check` with a header alone, or an
:class:`~commpress.collectives.fingerprint.Agreement`), with a digest of its own
(:data:`EXCHANGE_DIGEST`), the same on every exchanging rank whatever its call, and no
collective's. Ranks that all exchange agree and go on; against a rank that runs a
compressed collective instead, each side's check sees the other's digest, and every rank
raises :class:`~commpress.collectives.fingerprint.CollectiveMismatchError` naming both
calls (the exchanging one's algorithm as ``auto``), within the timeout, the group usable
after. That costs the first call of each shape one header and one all-reduce, and a kept
choice nothing. A kept choice of ``native`` runs torch's collective, which carries no
check: against an exchange it fails as torch's collectives do against any other (gloo may
end a process, or both time out), and that cannot be told from here."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress.codecs import get_codec
from commpress.collectives import inband
from commpress.collectives.failures import named_failures
from commpress.collectives.fingerprint import (
    REDUCTIONS,
    Agreement,
    CollectiveMismatchError,
    Fingerprint,
)
from commpress.collectives.work import in_queue_order
from commpress.ranks import by_rank, this_rank
from commpress.seeds import digest
from commpress.sim import tuner
from commpress.transport import backends, multicast
from commpress.transport.objects import all_gather_objects
from commpress.units import counted

AUTO = tuner.AUTO
#: Per group: the settings its choices were agreed under, and the choice of each call.
_agreed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: How many calls' choices a group keeps; past that the least recently used is dropped,
#: and its next call exchanges again: every rank drops the same, given the same calls.
KEPT_CHOICES = 1024
#: The collective a tuned call's errors name.
PUBLIC_NAMES = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}
#: What the tuner raises for a call it refuses (a codec refuses a dtype with TypeError), on
#: every rank alike once they have exchanged it.
REFUSALS = (ValueError, TypeError)
#: What the first call's exchange says in place of a collective's digest (no collective's).
EXCHANGE_DIGEST = digest(b"commpress: the tuner's exchange of its choice")
#: Per thread: the list :func:`recording` appends each tuned call's choice to.
_recording = threading.local()


def resolve(
    op: str,
    inp: torch.Tensor,
    group,
    codec,
    algorithm: str,
    error_feedback: bool = False,
    chunk_bytes: int | None = None,
    reduce_op: dist.ReduceOp.RedOpType | None = None,
    timeout: timedelta | None = None,
    argument: str = "inp.dtype",
) -> tuple[str, object]:
    """``(algorithm, codec)`` to run: as given, or the tuner's choice where either is auto
    (for a reduce-scatter cut in pieces of ``chunk_bytes``), the same on every rank of
    ``group``, the group the call runs on (a multicast's options are its own). A
    reduction's ``reduce_op`` (checked) is exchanged with the call: torch's collective,
    if chosen, would not compare it. A peer that does not join the first call's exchange
    within ``timeout`` (None: the group's) makes it raise, as the collective would.
    ``argument``: what a codec's refusal of the input's dtype calls it."""
    if not requested(codec, algorithm):
        return algorithm, codec
    reduction = "" if reduce_op is None else reduce_op.name
    call = _Call(op, inp.numel(), str(inp.dtype).removeprefix("torch."), _spec(codec), algorithm,
                 error_feedback, chunk_bytes, inp.device.type, reduction)  # fmt: skip
    agreed = _agreed_on(group)
    choice = _recalled(agreed, call)
    if choice is None:
        try:
            planned = _choose(call, codec, inp.dtype, group, argument)
        except REFUSALS as error:  # every rank must hear of it, not wait
            planned = error
        try:
            choice = _agree(group, inp.device, call, planned, _settings(group, call), timeout)
        finally:
            planned = None  # a refusal's traceback holds this frame
        _remember(agreed, call, choice)
    ran = getattr(_recording, "ran", None)
    if ran is not None:
        ran.append((choice.algorithm, choice.codec))
    return choice.algorithm, choice.codec


@contextlib.contextmanager
def recording():
    """A list of the ``(algorithm, codec)`` that each tuned call given on this thread
    within the block ran, in order (calls given ``algorithm`` and ``codec`` both fixed
    are not in it)."""
    outer = getattr(_recording, "ran", None)
    _recording.ran = []
    try:
        yield _recording.ran
    finally:
        _recording.ran = outer


def requested(codec, algorithm: str) -> bool:
    """Whether the tuner chooses for a call given ``codec`` and ``algorithm``."""
    return algorithm == AUTO or tuner.is_auto(codec)


def _spec(codec) -> str:
    """``codec`` as every rank that was given the same one names it (an auto spec by its
    budget and candidates, however it was spaced)."""
    if tuner.is_auto(codec):
        try:
            limit, candidates = tuner.budget(codec)
        except ValueError:  # the tuner refuses it, on every rank given it
            return codec.strip()
        return f"auto:max_rel_err={limit!r},codecs={'+'.join(candidates)}"
    try:
        return str(get_codec(codec))
    except (TypeError, ValueError):  # the tuner refuses it, on every rank given it
        return repr(codec)


def _recalled(agreed: collections.OrderedDict, call: _Call) -> tuner.Choice | None:
    """The choice agreed for ``call``, now the most recently used; None if none is kept."""
    choice = agreed.get(call)
    if choice is not None:
        agreed.move_to_end(call)
    return choice


def _remember(agreed: collections.OrderedDict, call: _Call, choice: tuner.Choice) -> None:
    agreed[call] = choice
    while len(agreed) > KEPT_CHOICES:
        agreed.popitem(last=False)


def _agreed_on(group) -> collections.OrderedDict:
    """The choices ``group``'s ranks agreed on, by call, while the settings every rank is
    given alike (the tuner's configuration, the group's multicast options set in code)
    stay as they were."""
    key = backends.or_world(group)
    # by value: a rank told the same again keeps its agreed choices, as its peers do
    settings = (tuner.configured(), multicast.options_set_for(group))
    found = _agreed.get(key)
    if found is None or found[0] != settings:
        found = _agreed[key] = (settings, collections.OrderedDict())
    return found[1]


def _choose(call: _Call, codec, dtype: torch.dtype, group, argument: str) -> tuner.Choice:
    """This rank's choice for ``call``."""
    return tuner.choose(
        call.op,
        call.numel,
        dtype,
        dist.get_world_size(group),
        codec,
        call.algorithm,
        on_cpu=call.device == "cpu",
        backend=backends.name(group),
        error_feedback=call.error_feedback,
        chunk_bytes=call.chunk_bytes,
        placement=placement(group),
        multicast=multicast_options(group, call.algorithm),
        argument=argument,
    )


def multicast_options(group, algorithm: str) -> multicast.Options | None:
    """The options ``group``'s multicast paces with, where the call may run a multicast;
    else None, and None where this rank cannot read them: the channel's set-up names that
    on every rank, where raising here would leave the other ranks waiting."""
    if not _may_multicast(algorithm, tuner.network()):
        return None
    try:
        return multicast.options_of(group)
    except ValueError:
        return None


def _may_multicast(algorithm: str, network: tuner.Network) -> bool:
    return algorithm == "multicast" or (algorithm == AUTO and "multicast" in network.algorithms)


def placement(group) -> tuner.Placement | None:
    """Where ``group``'s ranks sit in the tuner's network: on the hosts of their global
    ranks; None for the whole world in order."""
    if group is None:
        return None
    network_hosts = dist.get_world_size()
    hosts = tuple(dist.get_process_group_ranks(group))
    if hosts == tuple(range(network_hosts)):
        return None
    return tuner.Placement(hosts, network_hosts)


@dataclasses.dataclass(frozen=True)
class _Call:
    """What a tuned call was asked (the same on every rank of a correct program)."""

    op: str
    numel: int
    dtype: str
    codec: str
    algorithm: str
    error_feedback: bool
    chunk_bytes: int | None
    device: str
    reduction: str = ""  # the reduce op's name, for a reduction

    def __str__(self) -> str:
        said = (
            f"{self.op} of {counted(self.numel, f'{self.dtype} element')} on {self.device} with "
            f"codec={self.codec!r}, algorithm={self.algorithm!r}"
        )
        if self.reduction:
            said += f", op={self.reduction}"
        if self.error_feedback:
            said += ", error feedback"
        return said if self.chunk_bytes is None else f"{said}, chunk_bytes={self.chunk_bytes}"


@dataclasses.dataclass(frozen=True)
class _Planned:
    """One rank's side of the exchange: its call, its choice (or why it has none) and
    the settings it chose from."""

    call: _Call
    choice: tuner.Choice | None
    error: str | None
    settings: dict[str, str]

    @property
    def ran(self) -> str | None:
        return None if self.choice is None else str(self.choice)


def _settings(group, call: _Call) -> dict[str, str]:
    """What this rank's choice depends on beyond the call's arguments."""
    try:
        network = tuner.network()
    except ValueError as error:
        return {"tuner network": f"unreadable ({error})"}
    settings = {"tuner network": repr(network)}
    if _may_multicast(call.algorithm, network):
        try:
            settings["multicast options"] = repr(multicast.options_of(group))
        except ValueError as error:
            settings["multicast options"] = f"unreadable ({error})"
    return settings


def _agree(
    group, device: torch.device, call: _Call, planned, settings, timeout: timedelta | None
) -> tuner.Choice:
    """The choice every rank of ``group`` runs: this rank's, once every rank has said it
    chose the same; else every rank raises: the refusal every rank's tuner made, or
    ``ValueError`` saying why they differ."""
    failed = isinstance(planned, REFUSALS)
    mine = _Planned(call, None if failed else planned, str(planned) if failed else None, settings)
    everyone: list = []

    def exchange() -> None:
        with named_failures(PUBLIC_NAMES[call.op], call.codec, call.algorithm, group, timeout):
            _meet(group, device, call, timeout)
            everyone.extend(all_gather_objects(mine, group, timeout))

    in_queue_order(exchange, device)
    global_ranks = dist.get_process_group_ranks(backends.or_world(group))
    if len({p.call for p in everyone}) > 1:
        this = this_rank(dist.get_rank(group), global_ranks)
        raise CollectiveMismatchError(
            f"ranks called a tuned collective with different arguments (this is {this}): "
            f"{by_rank([str(p.call) for p in everyone], global_ranks)}"
        )
    if failed and all(p.error == mine.error for p in everyone):
        try:
            raise planned  # every rank's own, as without the exchange
        finally:
            planned = None  # its traceback holds this frame
    problem = _disagreement(everyone, global_ranks)
    if problem:
        raise ValueError(f"algorithm/codec 'auto', {call}: {problem}")
    return mine.choice


def _meet(group, device: torch.device, call: _Call, timeout: timedelta | None) -> None:
    """Open the exchange as a checked collective opens: every rank that exchanges agrees
    (:data:`EXCHANGE_DIGEST`); a rank that runs a compressed collective instead, its choice
    kept, disagrees, and every rank raises :class:`CollectiveMismatchError` naming both
    calls. A step of the group's checked collectives: it takes their next sequence number
    on every rank that exchanges, as the collective does on a rank that runs one."""
    reduction = call.reduction.lower()
    mine = Fingerprint(
        op=call.op,
        algorithm=AUTO,
        numel=call.numel,
        dtype=call.dtype,
        codec=call.codec,
        reduction=reduction if reduction in REDUCTIONS else "",
        chunk_bytes=call.chunk_bytes or 0,
    )
    if inband.applies(group, device):
        check = inband.Check(group, mine, timeout, device, chains=False, said=EXCHANGE_DIGEST)
        check.post_header()
        check.settle()
    else:
        Agreement(group, mine, timeout, device, said=EXCHANGE_DIGEST).check()


def _disagreement(everyone: list[_Planned], global_ranks: list[int] | None = None) -> str:
    """Why the ranks cannot run one choice ("" where they can)."""
    if any(p.error for p in everyone):
        said = [p.error or f"chose {p.ran}" for p in everyone]
        return f"not every rank's tuner could choose ({by_rank(said, global_ranks)})"
    if len({p.ran for p in everyone}) == 1:
        return ""
    chose = by_rank([p.ran for p in everyone], global_ranks)
    names = dict.fromkeys(name for p in everyone for name in p.settings)
    differing = [
        f"{name} ({by_rank([p.settings.get(name, 'none') for p in everyone], global_ranks)})"
        for name in names
        if len({p.settings.get(name) for p in everyone}) > 1
    ]
    why = "; ".join(differing) if differing else "none that this rank can name"
    return (
        f"the ranks' tuners chose differently ({chose}), so they would run different "
        f"collectives: give every rank the same settings; these differ: {why}"
    )
