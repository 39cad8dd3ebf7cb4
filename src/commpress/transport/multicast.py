"""The multicast transport of a process group: its channel, set up once, and its options.

A channel is one multicast group and port for the communicator, every rank's unicast
address, and the :class:`~commpress.transport.reliable_broadcast.Engine` whose thread runs
the protocol. It is set up on first use, collectively (every rank of the group takes part:
rank 0 picks the group, port and channel number; every rank binds its sockets and reports
its address or what failed, then starts its engine and reports whether it could, so a rank
that cannot set up makes every rank raise).

Options come from :func:`configure` (call it on every rank, before the first multicast
collective on the group), else from :func:`set_default_options` (every group of the
process, such as those FSDP and DDP make for commpress), else from the environment,
``COMMPRESS_MULTICAST``:
``rate=1gbit,roots=2,loss=0.01,seed=0,racks=2,uplink=500mbit,retry=0.02,ttl=1,burst=0.01`` (any
subset; ``ttl`` above 1 for multicast routed between subnets).
The local address is ``COMMPRESS_MULTICAST_ADDRESS``, else the address this host reaches
``MASTER_ADDR`` from; the group ``COMMPRESS_MULTICAST_GROUP=239.x.y.z:PORT`` (a group's
channel uses PORT + n, n the lowest that no open channel of any of its ranks uses), else
random in 239.255.0.0/16 (administratively scoped: it does not leave the site). Ranks agree
on the smallest MTU of their interfaces.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import itertools
import os
import random
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from commpress._torch_private import group_timeout
from commpress.ranks import by_rank, name_ranks, this_rank
from commpress.spec_options import parse_options
from commpress.transport import backends
from commpress.transport.objects import all_gather_objects
from commpress.transport.reliable_broadcast import (
    OPERATION_IDS,
    Engine,
    Operation,
    Options,
    newer,
)
from commpress.transport.udp import MulticastSetupError, UdpNetwork, route_source
from commpress.units import parse_rate_bits

ENVIRONMENT = "COMMPRESS_MULTICAST"
_ENV_KEYS = {
    "rate": ("rate_bits", str),
    "roots": ("concurrent_roots", int),
    "loss": ("loss", float),
    "seed": ("seed", int),
    "racks": ("racks", int),
    "uplink": ("uplink_bits", str),
    "retry": ("retry_s", float),
    "ttl": ("ttl", int),
    "burst": ("burst_s", float),
}
MAX_RANKS = 2**16 - 1  # ranks are 16-bit fields of the datagram header
CHANNELS = 2**16 - 1  # channel numbers 1 to this: a 16-bit field of the header, 0 unused
MAX_PORT = 65535
_channels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_configured: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_default: Options | None = None


def options_from_text(text: str) -> Options:
    """``"rate=1gbit,roots=2,loss=0.01"`` as :class:`Options`."""
    raw = parse_options(text, {k: kind for k, (_, kind) in _ENV_KEYS.items()}, text, ENVIRONMENT)
    values = {}
    for key, value in raw.items():
        name = _ENV_KEYS[key][0]
        values[name] = parse_rate_bits(value, key) if name.endswith("_bits") else value
    return Options(**values)


def configure(group: dist.ProcessGroup | None = None, options: Options | None = None, **kw):
    """Set the multicast options of ``group`` (every rank, the same): an :class:`Options`,
    or its fields as keywords. A channel already set up with other options is closed; the
    next multicast collective sets up a new one. On a rank outside ``group`` (``new_group``
    gave it ``NON_GROUP_MEMBER``) the options are checked, and nothing is set."""
    chosen = dataclasses.replace(options or Options(), **kw)
    if _outside(group):
        return
    group = backends.or_world(group)
    channel = _channels.get(group)
    if channel is not None and channel.options != chosen:
        channel.close()
        del _channels[group]
    _configured[group] = chosen


def _outside(group) -> bool:
    """Whether ``group`` is what ``new_group`` returns on a rank outside the group."""
    return type(group) is int and group == dist.GroupMember.NON_GROUP_MEMBER


def set_default_options(options: Options | None) -> None:
    """The options of every group that :func:`configure` has not set (None: read them from
    the environment again). Channels already set up keep theirs."""
    global _default
    _default = options


def options_set_for(group: dist.ProcessGroup | None) -> tuple[Options | None, Options | None]:
    """The options set in code for ``group``: :func:`configure`'s and
    :func:`set_default_options`' (None where not set; the environment's are not read)."""
    return _configured.get(backends.or_world(group)), _default


def is_set_up(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` has its channel already (this rank's view; no communication)."""
    return backends.or_world(group) in _channels


def options_of(group: dist.ProcessGroup | None) -> Options:
    """The options ``group``'s channel runs with, or will run with once set up (this
    rank's view; no communication): its own, else :func:`configure`'s, else
    :func:`set_default_options`'s, else the environment's (ValueError naming it where it
    cannot be read)."""
    group = backends.or_world(group)
    channel = _channels.get(group)
    if channel is not None:
        return channel.options
    options = _configured.get(group, _default)
    if options is not None:
        return options
    parsed = _environment_options(os.environ.get(ENVIRONMENT, ""))
    if isinstance(parsed, str):
        raise ValueError(parsed)
    return parsed


@functools.lru_cache(maxsize=8)  # read on every tuned call: parsed once per value
def _environment_options(text: str) -> Options | str:
    """``COMMPRESS_MULTICAST``'s options, or why they cannot be read."""
    try:
        return options_from_text(text)
    except (TypeError, ValueError) as error:
        return f"{ENVIRONMENT}: {error}"


def channel_for(group: dist.ProcessGroup | None, timeout: timedelta | None = None) -> Channel:
    """The group's channel, set up on first use (collectively: call on every rank; a peer
    that does not join within ``timeout``, None: the group's, makes it raise)."""
    group = backends.or_world(group)
    channel = _channels.get(group)
    if channel is None:
        _close_channels_of_destroyed_groups()
        options, problem = None, None
        try:
            options = options_of(group)
        except ValueError as error:  # every rank must hear of it, not wait
            problem = str(error)
        channel = _channels[group] = Channel(group, options, problem, timeout)
    return channel


def _close_channels_of_destroyed_groups() -> None:
    """A destroyed group (``dist.destroy_process_group``) that something still refers to
    kept its channel, and with it the engine's thread and sockets, for as long as it was
    referred to; each new channel lets go of those."""
    for group in [g for g in _channels if not backends.registered(g)]:
        _channels.pop(group).close()


class Channel:
    """A process group's multicast group, sockets and protocol thread. Every rank sets it
    up at once (three all-gathers of small objects on ``group``: the addresses, the
    sockets, the engines; after each, a failure anywhere is raised everywhere); its thread
    and sockets go when it is garbage-collected, closed, at exit, or when another channel is
    set up after its group was destroyed."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        options: Options,
        problem: str | None = None,
        timeout: timedelta | None = None,
    ):
        """``problem``: why this rank has no options (every rank raises it); ``timeout``:
        how long each exchange waits for the slowest peer (None: the group's)."""
        self.options = options
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        if self.world_size > MAX_RANKS:
            raise MulticastSetupError(
                f"multicast numbers ranks in 16 bits: a group of {self.world_size} is too large"
            )
        self._last_operation: int | None = None
        local, drawn = None, None
        failure = problem
        try:
            if problem is None:
                local = _local_address()
                drawn = _draw_group() if self.rank == 0 else None
        except (MulticastSetupError, ValueError) as error:
            failure = str(error)
        in_use = tuple(sorted(_indices_in_use))
        addresses = all_gather_objects((local, drawn, failure, in_use), group, timeout)
        ranks = self.global_ranks = dist.get_process_group_ranks(group)
        _raise_failures([f for _, _, f, _ in addresses], ranks)
        # free on every rank of the group: none has two open channels on one port
        index = _lowest_free({used for *_, in_use in addresses for used in in_use})
        try:
            self.group_address, channel_number = _placed(addresses[0][1], index)
        except ValueError as error:  # the same on every rank
            raise MulticastSetupError(str(error)) from None
        shared = [a for a, *_ in addresses].count(local) > 1
        network, failure, cause = None, None, None
        try:
            network = UdpNetwork(
                self.rank,
                self.world_size,
                local,
                self.group_address,
                shared_host=shared,
                ttl=options.ttl,
            )
        except Exception as error:  # noqa: BLE001 - every rank must hear of it, not wait
            failure, cause = _described(error), error
        report = (failure, None) if network is None else (None, network.unicast_address)
        mtu = None if network is None else network.mtu
        engine = None
        try:
            reports = all_gather_objects((*report, mtu), group, timeout)
            _raise_failures([f for f, _, _ in reports], ranks, cause)
            try:
                network.connect([address for _, address, _ in reports])
                network.mtu = min(m for _, _, m in reports)  # every rank cuts payloads alike
                engine = Engine(network, channel_number, options, ranks)
            except Exception as error:  # noqa: BLE001 - not a peer waiting at the first operation
                failure, cause = _described(error), error
            outcomes = all_gather_objects(failure, group, timeout)
            _raise_failures(outcomes, ranks, cause)
        except BaseException:  # a peer gone, or setup failed elsewhere: no sockets left bound
            cause = None  # its traceback holds this frame: a cycle that kept the group alive
            if engine is not None:
                engine.close()  # and its network
            elif network is not None:
                network.close()
            raise
        self.network, self.engine = network, engine
        _indices_in_use.add(index)
        self._close = weakref.finalize(self, _close_engine, self.engine, index)  # also at exit

    def operation_id(self, call: int) -> int:
        """The id of the operation of collective call number ``call`` on the group (the same
        on every rank; 32 bits, wrapping around). Ids must increase: the protocol tells a
        faster peer's next operation from a stale one by them."""
        operation = call % OPERATION_IDS
        if self._last_operation is not None and not newer(operation, self._last_operation):
            raise ValueError(
                f"multicast call number {call} comes after operation {self._last_operation} "
                "on this channel: call numbers must increase"
            )
        self._last_operation = operation
        return operation

    def close(self) -> None:
        self._close()


#: The indices of this process's open channels: a fixed COMMPRESS_MULTICAST_GROUP's port +
#: index is each one's port, free again once it is closed.
_indices_in_use: set[int] = set()


def _lowest_free(used: set[int]) -> int:
    return next(index for index in itertools.count() if index not in used)


def _close_engine(engine: Engine, index: int) -> None:
    """Close a channel's engine (and its sockets), then free its port."""
    engine.close()
    _indices_in_use.discard(index)


def _described(error: Exception) -> str:
    """A failure to set up, as the error that every rank raises names it."""
    return str(error) if isinstance(error, (MulticastSetupError, OSError)) else repr(error)


def _raise_failures(
    failures: list[str | None], global_ranks: list[int], cause: BaseException | None = None
) -> None:
    """Every rank raises the same error when any rank could not set up (``failures``: each
    rank's, or None), naming the ranks of each failure once; ``cause``: this rank's own,
    whose traceback it keeps."""
    said = by_rank([failure or None for failure in failures], global_ranks)
    if said:
        raise MulticastSetupError("multicast cannot be set up: " + said) from cause


#: torch's own default for a process group whose timeout cannot be read.
DEFAULT_TIMEOUT = timedelta(minutes=30)


class Broadcasts:
    """One schedule's broadcasts, posted together: ``with Broadcasts(group, buffers, call,
    timeout) as posted: posted.of(root).wait(timeout)``. ``buffers`` maps each root, in the
    schedule's order, to its payload (uint8, on the CPU): this rank's own is sent, the
    others are received into. ``call``: the collective's sequence number on the group, the
    same on every rank (:meth:`Channel.operation_id`). Leaving the ``with`` block, finished
    or not, stops the transport's writes into them."""

    def __init__(
        self, group, buffers: dict[int, torch.Tensor], call: int, timeout: timedelta | None
    ):
        for root, buffer in buffers.items():
            if buffer.device.type != "cpu":
                raise ValueError(
                    f"multicast moves CPU tensors only; the payload of rank {root} is on "
                    f"{buffer.device}"
                )
        self._channel = channel_for(group, timeout)
        rank = self._channel.rank
        views = {root: memoryview(buffer.numpy()).cast("B") for root, buffer in buffers.items()}
        own = views.pop(rank)
        self._timeout = timeout or _group_timeout(group)
        operation = self._channel.operation_id(call)
        self.operation = Operation(operation, list(buffers), own, views)

    def __enter__(self) -> Broadcasts:
        self._channel.engine.post(self.operation)
        return self

    def __exit__(self, *exc_info) -> None:
        self._channel.engine.abandon(self.operation)

    def of(self, root: int) -> _Broadcast:
        return _Broadcast(self, root)


class _Broadcast:
    def __init__(self, broadcasts: Broadcasts, root: int):
        self._broadcasts, self._root = broadcasts, root

    def wait(self, timeout: timedelta | None) -> None:
        """Until the root's payload is here (this rank's own: every peer has it)."""
        posted = self._broadcasts
        limit = timeout or posted._timeout
        if not posted.operation.wait(self._root, limit.total_seconds()):
            channel = posted._channel
            rank, global_ranks = channel.rank, channel.global_ranks
            what = (
                "not every peer acknowledged this rank's broadcast"
                if self._root == rank
                else f"the broadcast of {name_ranks([self._root], global_ranks)} did not arrive"
            )
            raise RuntimeError(
                f"multicast all-gather on {this_rank(rank, global_ranks)} timed out: {what} "
                f"within {limit} (a peer stopped, or the network drops every datagram); "
                + channel.engine.describe(posted.operation, global_ranks)
            )


def _group_timeout(group) -> timedelta:
    return group_timeout(backends.or_world(group)) or DEFAULT_TIMEOUT


def _local_address() -> str:
    chosen = os.environ.get("COMMPRESS_MULTICAST_ADDRESS")
    if chosen:
        return chosen
    master = os.environ.get("MASTER_ADDR")
    if not master:
        raise MulticastSetupError(
            "cannot tell which interface to multicast on: set COMMPRESS_MULTICAST_ADDRESS "
            "to this host's address on the cluster network (or MASTER_ADDR); on one machine, "
            "run on the emulated cluster (commpress launch --hosts N, "
            "commpress.cluster.Emulated), whose hosts multicast"
        )
    return route_source(master)


def _draw_group() -> tuple[tuple[str, int], int, bool]:
    """``((address, port), channel number, fixed)``: COMMPRESS_MULTICAST_GROUP's address and
    port (``fixed``: the port of a group's first channel, :func:`_placed`), else random; the
    channel number is random either way (two jobs on one fixed group and port, or disjoint
    subgroups set up at the same index, are told apart by it alone)."""
    chosen = os.environ.get("COMMPRESS_MULTICAST_GROUP")
    rng = random.SystemRandom()
    channel = rng.randrange(1, CHANNELS + 1)
    if chosen:
        address, _, port = chosen.rpartition(":")
        try:
            multicast = ipaddress.IPv4Address(address).is_multicast
        except ValueError:
            multicast = False
        if not multicast or not _is_port(port):
            raise ValueError(
                f"COMMPRESS_MULTICAST_GROUP={chosen!r} must be an IPv4 multicast ADDRESS:PORT, "
                f"PORT in [1, {MAX_PORT}], e.g. 239.255.12.34:45000"
            )
        return (address, int(port)), channel, True
    return (
        (f"239.255.{rng.randrange(1, 255)}.{rng.randrange(1, 255)}", rng.randrange(40000, 60000)),
        channel,
        False,
    )


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_PORT


def _placed(drawn: tuple[tuple[str, int], int, bool], index: int) -> tuple[tuple[str, int], int]:
    """``((address, port), channel number)`` of the channel at ``index`` (agreed by the
    group's ranks) from what :func:`_draw_group` drew: a fixed group's port + ``index``."""
    (address, port), channel, fixed = drawn
    if not fixed:
        return (address, port), channel
    if port + index > MAX_PORT:
        raise ValueError(
            f"COMMPRESS_MULTICAST_GROUP={address}:{port}: channel {index} would use port "
            f"{port + index}, above {MAX_PORT} (open channels of the group's ranks hold the "
            "ports below): close some, or choose a lower PORT"
        )
    return (address, port + index), channel
