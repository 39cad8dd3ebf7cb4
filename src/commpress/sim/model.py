"""The cost model: the runtime's own schedules, timed on a topology.

For one call, the model reads rank 0's schedule from :func:`commpress.schedules.plan`
(every registered algorithm is rank-symmetric: rank r's schedule is rank 0's with every
peer shifted by r, which ``tests/unit/test_sim.py`` checks), places every rank's sends of
each step on the topology's links, and times the step as

    message overhead + latency x links on the longest path + busiest link's bytes / rate

where a link's rate is scaled by the fraction a transfer reaches on its level (host links,
or the links above them: :attr:`Params.uplink_efficiency`), and on the host links of a
step in which every rank exchanges with a single peer both ways
(:attr:`Params.exchange_efficiency`)

(the bandwidth-bound step of the alpha-beta model; every rank's step i runs at once),
plus a time per call (:attr:`Params.call_s`). Codec work is added where the executor
cannot overlap it: the first encodes; each received payload's handling overlaps the next
step's transfer unless that step forwards what the handling rewrites (as the executor
does); the last handling ends the call.

* point-to-point schedules (``ring``, ``ring-hop``): as above, step by step.
* ``backend``'s all-gather: the backend's own collective is taken to be a ring in rank
  order (NCCL's and gloo's ring): n - 1 steps of one payload each, then every decode.
* the all-to-all (``alltoall``, ``backend`` reduce-scatter): one step per piece (``backend``:
  one), every pair at once, n - 1 messages per rank; a piece's decodes and sums overlap the
  next piece's exchange.
* ``multicast``: rounds of K roots in the schedule's order, each round's roots paced as the
  runtime paces them (:meth:`~commpress.transport.reliable_broadcast.Options.rounds` and
  ``pace_bytes_per_s``, at the options' nominal rates: a smaller last round sends faster),
  each root's payload crossing each link of its tree once; the time is the larger of the
  paced rounds and the busiest link (at the fraction of its rate it reaches).
* ``native``: torch's own collective, taken as the codec ``none`` ring (all-gather) and
  ring reduce-scatter in whole chunks.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from commpress.codecs import get_codec
from commpress.schedules import (
    Prepare,
    Schedule,
    Then,
    Transport,
    input_numel,
    moved_bytes,
    plan,
)
from commpress.schedules.registry import NATIVE
from commpress.sim.topology import Topology
from commpress.transport.reliable_broadcast import Options

#: Handling a received payload, in codec passes over the chunk piece.
_PASSES = {
    Then.DECODE: (1, 0),  # (decodes, encodes)
    Then.DECODE_REENCODE: (1, 1),
    Then.ADD_REENCODE: (1, 1),
    Then.ADD_KEEP: (1, 0),
    Then.SUM: (1, 0),
}


#: The kinds of link time a call can be bound by, each with the Params field of its
#: efficiency: host links, the links above them, and host links in a step where each rank
#: exchanges with a single peer (every step on two ranks).
LEVEL_EFFICIENCIES = {
    "host": "efficiency",
    "uplink": "uplink_efficiency",
    "exchange": "exchange_efficiency",
}
#: Efficiencies a fit may leave out (no rows of that kind): the host links' applies.
OPTIONAL_EFFICIENCIES = tuple(f for level, f in LEVEL_EFFICIENCIES.items() if level != "host")


@dataclasses.dataclass(frozen=True)
class Params:
    """What the model assumes about the machines; every field is data a fit can set.
    ``message_s``, ``call_s`` and each efficiency may be one value or one per algorithm (a
    fit's)."""

    latency_s: float = 1e-6  # per link a message crosses
    message_s: float | dict = 10e-6  # per message: posting, matching, waking the receiver
    #: per call, whatever its messages: checking the arguments, handing the call to the
    #: communication thread, and, for a schedule that is not a chain on gloo, the argument
    #: check's header and all-reduce (``benchmarks/backend_check_2026-12-06/``). A fit's
    #: per algorithm; none there: 0. Taken as constant in the hosts: that all-reduce grows
    #: with them, which a fit of few world sizes cannot see.
    call_s: float | dict = 0.0
    efficiency: float | dict = 1.0  # the fraction of a host link's rate a transfer reaches
    #: The same for the links above the hosts' (a rack's uplink, a fat tree's edge and core
    #: links); ``None``: ``efficiency``. On the emulated racks a transfer reaches a different
    #: fraction of the shared uplink's rate than of its own host link's
    #: (``benchmarks/tuner_2026-11-26/README.md``).
    uplink_efficiency: float | dict | None = None
    #: The same for the host links in a step where each rank sends to and receives from
    #: one peer only (every step on two ranks); ``None``: ``efficiency``. A fitted factor:
    #: gloo was measured to serialise such an exchange at random when both ranks post
    #: their send first, and its own collectives are inferred to do so
    #: (``benchmarks/two_ranks_2026-11-27/README.md``); other backends need fits of their own.
    exchange_efficiency: float | dict | None = None
    #: codec -> (encode, decode) throughput in bytes of fp32 input per second; a codec not
    #: listed costs nothing (a GPU's codec kernels run at memory bandwidth, far above links)
    codec_bytes_per_s: dict = dataclasses.field(default_factory=dict)
    concurrent_roots: int = 2  # multicast K
    #: When every host's processes share this many cores (our emulated cluster: all hosts
    #: on one 2-core machine), per-call, per-message and codec work take ``nodes / shared_cores``
    #: times longer. ``None``: each host has its own (a real cluster).
    shared_cores: int | None = None

    def __post_init__(self):
        for name, low, high in (("latency_s", 0, None), ("message_s", 0, None),
                                ("call_s", 0, None),
                                ("efficiency", 0, 1), ("uplink_efficiency", 0, 1),
                                ("exchange_efficiency", 0, 1)):  # fmt: skip
            values = getattr(self, name)
            if values is None and name in OPTIONAL_EFFICIENCIES:
                continue
            for value in values.values() if isinstance(values, dict) else (values,):
                in_range = low <= value < math.inf if high is None else 0 < value <= high
                if not in_range:  # NaN too
                    raise ValueError(f"{name} out of range: {value}")
        for codec, speeds in self.codec_bytes_per_s.items():
            if len(speeds) != 2 or not all(0 < speed < math.inf for speed in speeds):
                raise ValueError(
                    f"codec_bytes_per_s[{codec!r}] must be (encode, decode) bytes per second, "
                    f"both positive and finite, got {speeds!r}"
                )
        object.__setattr__(self, "codec_bytes_per_s", _by_canonical_spec(self.codec_bytes_per_s))

    def for_call(self, op: str, algorithm: str, nodes: int) -> Params:
        """These params for one call: a fit's values for ``op/algorithm`` (or, failing
        that, ``algorithm``) resolved, and CPU work scaled by the cores hosts share."""
        resolved = {}
        for name in ("message_s", "call_s", "efficiency", *OPTIONAL_EFFICIENCIES):
            values = getattr(self, name)
            if isinstance(values, dict):
                key = next((k for k in (f"{op}/{algorithm}", algorithm) if k in values), None)
                if key is None and name in OPTIONAL_EFFICIENCIES:  # no rows of that kind
                    resolved[name] = None
                    continue
                if key is None and name == "call_s":  # not told apart from the messages
                    resolved[name] = 0.0
                    continue
                if key is None:
                    raise ValueError(
                        f"the fit has no {name} for {op} {algorithm!r} (it has "
                        f"{sorted(values)}): calibrate with `commpress bench` rows of it"
                    )
                resolved[name] = values[key]
        if self.shared_cores:
            slowdown = max(1.0, nodes / self.shared_cores)
            for name in ("message_s", "call_s"):
                resolved[name] = resolved.get(name, getattr(self, name)) * slowdown
            resolved["codec_bytes_per_s"] = {
                codec: (encode / slowdown, decode / slowdown)
                for codec, (encode, decode) in self.codec_bytes_per_s.items()
            }
        return dataclasses.replace(self, **resolved, shared_cores=None)

    def level_efficiency(self, level: str, exchange: bool = False) -> float:
        """The efficiency on the links of topology level ``level`` ("host up", "uplink
        down", ...), once resolved for a call; ``exchange``: in a step where each rank
        exchanges with a single peer."""
        if not level.startswith("host"):
            return self.efficiency if self.uplink_efficiency is None else self.uplink_efficiency
        if exchange and self.exchange_efficiency is not None:
            return self.exchange_efficiency
        return self.efficiency

    def codec_s(self, codec: str, numel: int, encodes: int, decodes: int) -> float:
        rates = self.codec_bytes_per_s.get(codec)
        if rates is None or not numel:
            return 0.0
        encode, decode = rates
        return numel * 4 * (encodes / encode + decodes / decode)


@dataclasses.dataclass(frozen=True)
class Row:
    nodes: int
    op: str
    algorithm: str
    codec: str
    size_bytes: int
    topology: str
    link_bits: float
    time_us: float
    tx_bytes_per_host: int  # what one host injects
    fabric_bytes: float  # summed over every link the bytes cross
    busiest_link_bytes: float
    bottleneck: str  # the level of the busiest link, relative to the rate it reaches

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def simulate(
    op: str,
    algorithm: str,
    codec: str,
    size_bytes: int,
    topology: Topology,
    params: Params | None = None,
    dtype: torch.dtype = torch.float32,
    chunk_bytes: int | None = None,
    multicast: Options | None = None,
) -> Row:
    """One call of ``op`` on ``topology.ranks`` ranks; ``size_bytes`` as nccl-tests count
    it (an all-gather's output, a reduction's input); ``chunk_bytes`` the pieces a ring
    reduce-scatter pipelines (default the collective's); ``multicast`` the options the
    runtime's multicast transport paces with (default: the topology's link rates and
    ``params.concurrent_roots``, as a transport configured for that network would)."""
    n = topology.ranks
    params = (Params() if params is None else params).for_call(op, algorithm, n)
    if op not in ("all_gather", "reduce_scatter"):
        raise ValueError(f"op must be all_gather or reduce_scatter, got {op!r}")
    numel = input_numel(op, size_bytes, n, dtype)  # rounded down as `commpress bench` does
    if numel < 1:
        raise ValueError(f"size {size_bytes} B holds no {dtype} element for each of {n} nodes")
    if algorithm == NATIVE:
        codec, ran = "none", "ring" if op == "all_gather" else "ring-hop"
    else:
        ran = algorithm
    codec = str(get_codec(codec))
    (schedule,) = plan(op, ran, 0, n, numel, dtype, codec, chunk_bytes)
    timing = _Timing(topology, params, codec, multicast)
    time_s = params.call_s + timing.run(schedule)
    bottleneck, busiest = timing.bottleneck()
    return Row(
        nodes=n,
        op=op,
        algorithm=algorithm,
        codec=codec,
        size_bytes=moved_bytes(op, numel, n, dtype),
        topology=str(topology),
        link_bits=topology.link_bits,
        time_us=time_s * 1e6,
        tx_bytes_per_host=schedule.sent_bytes,
        fabric_bytes=float(sum(loads.sum() for loads in timing.totals.values())),
        busiest_link_bytes=busiest,
        bottleneck=bottleneck,
    )


class _Timing:
    """Times a schedule step by step and adds up each level's bytes."""

    def __init__(self, topology: Topology, params: Params, codec: str, multicast=None):
        self.topology, self.params, self.codec = topology, params, codec
        self.multicast: Options | None = multicast
        self.levels = {level.name: level for level in topology.levels()}
        self._patterns: dict[tuple, tuple[float, dict, bool]] = {}
        #: each distinct step's loads, whether it was a single-peer exchange, and how many
        #: times it ran: summed once at the end, not a pass over every link at every step
        self._added: dict[tuple, list] = {}

    def run(self, schedule: Schedule) -> float:
        if schedule.transport is Transport.P2P:
            return self._point_to_point(schedule)
        if schedule.transport is Transport.ALL_GATHER:
            return self._backend_all_gather(schedule)
        if schedule.transport is Transport.ALL_TO_ALL:
            return self._all_to_all(schedule)
        return self._multicast(schedule)

    # -- the parts ----------------------------------------------------------------------

    def _point_to_point(self, schedule: Schedule) -> float:
        p = self.params
        encodes = [s for step in schedule.steps for s in step.sends if s.prepare is Prepare.ENCODE]
        total = sum(p.codec_s(self.codec, s.numel, 1, 0) for s in encodes)
        pending = 0.0  # the handling of the last step's receives, not done yet
        for index, step in enumerate(schedule.steps):
            wire = self._step_s(tuple((dst, s.wire_bytes) for s in step.sends for dst in s.dsts))
            forwarded = {(s.chunk, s.piece) for s in step.sends if s.prepare is Prepare.FORWARD}
            previous = schedule.steps[index - 1].receives if index else ()
            waits = any(
                (r.chunk, r.piece) in forwarded and r.then.rewrites_payload for r in previous
            )
            total += pending + wire if waits else max(pending, wire)
            pending = sum(self._handle_s(r) for r in step.receives)
        return total + pending

    def _backend_all_gather(self, schedule: Schedule) -> float:
        (step,) = schedule.steps
        (own,) = step.sends
        ring = sum(self._step_s(((1, own.wire_bytes),)) for _ in range(schedule.world_size - 1))
        handling = sum(self._handle_s(r) for r in step.receives)
        encode = self.params.codec_s(self.codec, own.numel, 1, 0)
        return encode + ring + handling

    def _all_to_all(self, schedule: Schedule) -> float:
        """Every encode first, then one exchange per piece, a piece's sums overlapping the
        next piece's exchange."""
        sends = [s for step in schedule.steps for s in step.sends]
        total = sum(self.params.codec_s(self.codec, s.numel, 1, 0) for s in sends)
        pending = 0.0  # the sums of the last piece, not done yet
        for step in schedule.steps:
            messages = tuple((dst, s.wire_bytes) for s in step.sends for dst in s.dsts)
            exchange = self._step_s(messages) + (len(messages) - 1) * self.params.message_s
            total += max(pending, exchange)
            pending = sum(self._handle_s(r) for r in step.receives)
        return total + pending

    def _multicast(self, schedule: Schedule) -> float:
        n, p = schedule.world_size, self.params
        wire = next(s.wire_bytes for step in schedule.steps for s in step.sends)
        loads = self.topology.broadcast_bytes(wire)
        self._add(("broadcast",), loads)
        options = self._multicast_options()
        order = [_root_of(step, schedule.rank) for step in schedule.steps]
        overhead = p.message_s + p.latency_s * self.topology.longest_path()
        paced = sum(
            overhead + wire / options.pace_bytes_per_s(roots, n) for roots in options.rounds(order)
        )
        bound = self._busiest_s(loads)
        decode = p.codec_s(self.codec, schedule.chunk_numel, 0, 1)
        receiving = max(paced, bound, (n - 1) * decode)
        return p.codec_s(self.codec, schedule.chunk_numel, 1, 0) + receiving + decode

    def _multicast_options(self) -> Options:
        """The runtime's pacing options: as given, or those of a transport configured for
        this topology's links."""
        if self.multicast is not None:
            return self.multicast
        return Options(
            rate_bits=max(1, int(self.topology.link_bits)),
            concurrent_roots=self.params.concurrent_roots,
            racks=getattr(self.topology, "count", 1),
            uplink_bits=_whole_bits(getattr(self.topology, "uplink_bits", None)),
        )

    # -- helpers ------------------------------------------------------------------------

    def _step_s(self, sends: tuple) -> float:
        """One step in which every rank r sends ``bytes`` to ``r + dst`` (mod n) for each
        ``(dst, bytes)`` of rank 0's ``sends``."""
        found = self._patterns.get(sends)
        if found is None:
            hosts = self.topology.hosts
            n = len(hosts)
            offsets = np.array([d for d, _ in sends], dtype=np.int64)
            sizes = np.array([b for _, b in sends], dtype=float)
            src = np.tile(np.arange(n), len(sends))
            dst = (src + np.repeat(offsets, n)) % n
            loads = self.topology.flow_bytes(hosts[src], hosts[dst], np.repeat(sizes, n))
            path = self.topology.longest_path()
            exchange = _single_peer_exchange(offsets, n)
            busiest = self._busiest_s(loads, exchange)
            seconds = self.params.message_s + self.params.latency_s * path + busiest
            found = self._patterns[sends] = (seconds, loads, exchange)
        seconds, loads, exchange = found
        self._add(sends, loads, exchange)
        return seconds

    @property
    def totals(self) -> dict[str, np.ndarray]:
        """The bytes each link of each level carried over the call."""
        totals = {}
        for loads, _, times in self._added.values():
            for name, bytes_ in loads.items():
                totals[name] = totals.get(name, 0.0) + times * np.asarray(bytes_, dtype=float)
        return totals

    @property
    def busy_s(self) -> dict[str, np.ndarray]:
        """The seconds each link of each level was busy, each step's bytes at the efficiency
        of that step (a single-peer exchange or not)."""
        busy = {}
        for loads, exchange, times in self._added.values():
            for name, bytes_ in loads.items():
                busy[name] = busy.get(name, 0.0) + times * self._link_s(name, bytes_, exchange)
        return busy

    def bottleneck(self) -> tuple[str, float]:
        """The level whose links were busiest in time over the whole call, and the bytes
        its busiest link carried ("" and 0 when nothing was sent)."""
        busy = self.busy_s
        if not busy:
            return "", 0.0
        name = max(busy, key=lambda level: float(busy[level].max(initial=0.0)))
        return name, float(self.totals[name].max(initial=0.0)) / self.levels[name].width

    def _link_s(self, name: str, bytes_: np.ndarray, exchange: bool) -> np.ndarray:
        level = self.levels[name]
        reached = level.rate_bits * self.params.level_efficiency(name, exchange)
        return np.asarray(bytes_, dtype=float) / level.width * 8 / reached

    def _busiest_s(self, loads: dict, exchange: bool = False) -> float:
        return max(
            float(self._link_s(name, bytes_, exchange).max(initial=0.0))
            for name, bytes_ in loads.items()
        )

    def _handle_s(self, receive) -> float:
        decodes, encodes = _PASSES[receive.then]
        return self.params.codec_s(self.codec, receive.numel, encodes, decodes)

    def _add(self, step: tuple, loads: dict, exchange: bool = False) -> None:
        """One more run of ``step``, whose links carry ``loads``."""
        self._added.setdefault(step, [loads, exchange, 0])[2] += 1


def _by_canonical_spec(speeds: dict) -> dict:
    """``speeds`` keyed by each codec's canonical spec, which is what a call is timed with:
    ``commpress codecs`` keys a row by the spec as given (``zfp:rate=16``, ``int8:block=256``
    for ``zfp`` and ``int8``). A spec no registered codec reads (one a program registers
    later) is kept as given."""
    canonical = {}
    for spec, rates in speeds.items():
        name = _canonical_spec(spec)
        if canonical.setdefault(name, tuple(rates)) != tuple(rates):
            raise ValueError(
                f"codec_bytes_per_s gives {name} two speeds, {canonical[name]} and "
                f"{tuple(rates)} (under {spec!r})"
            )
    return canonical


def _canonical_spec(spec: str) -> str:
    try:
        return str(get_codec(spec))
    except (TypeError, ValueError):
        return spec


def _root_of(step, rank: int) -> int:
    """The root of a multicast schedule's step, in the schedule of rank ``rank``."""
    return rank if step.sends else step.receives[0].src


def _whole_bits(bits: float | None) -> int | None:
    return None if bits is None else max(1, int(bits))


def _single_peer_exchange(offsets: np.ndarray, n: int) -> bool:
    """Whether a step whose every rank r sends to ``r + d`` for each ``d`` of ``offsets``
    has each rank send to, and receive from, one and the same peer."""
    if not len(offsets):
        return False
    first = int(offsets[0]) % n
    return bool(np.all(offsets % n == first)) and (2 * first) % n == 0 and first != 0
