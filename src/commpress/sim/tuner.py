"""``algorithm="auto"`` and ``codec="auto:max_rel_err=E"``: the cost model chooses per call.

For a call (op, elements, dtype, ranks), the tuner times every candidate pair of algorithm
and codec with :func:`~commpress.sim.model.simulate` on the network it was told about and
takes the fastest. With ``codec="auto:max_rel_err=E"`` the candidate pairs are those
whose expected relative error in the call's result is at most ``E``: one encode's
(``||x - decode(encode(x))|| / ||x||`` on a fixed, seeded Gaussian sample, measured once
per process) grown along the algorithm's schedule for that many ranks
(:func:`~commpress.schedules.error_growth.error_growth`: a ring reduce-scatter re-encodes
each partial sum at every hop, so int8 errs about 1.9 times one encode's on 8 ranks).
``none`` always qualifies, and ``auto:max_rel_err=E,codecs=int8+int4`` restricts the
codecs. Every rank
computes the same choice from the same settings. Choices are cached per (op, elements, dtype, ranks,
backend, request, network), the :data:`KEPT_MODEL_CHOICES` most recently used, and each is logged
when it is made (logger ``commpress.tuner``, level INFO).
Every rank must be given the same settings: a rank that chose differently would run a
different collective, and where one of them is ``native`` (which has no argument check)
the ranks could hang, or one of them be ended by gloo. So a collective's ranks exchange
their choices on its first call of each shape (:mod:`commpress.collectives.auto`): where
they differ, or a rank could not choose, every rank raises, naming the settings that differ.
Ranks whose arguments differ raise :class:`~commpress.collectives.fingerprint.
CollectiveMismatchError` on such a first call; on a later one, where the tuner gives the
call to torch, they are not told apart (as with an explicit ``native``).

The network comes from :func:`configure` or the environment: ``COMMPRESS_TUNE_TOPOLOGY``
(``switch``, ``racks:count=2,uplink=500mbit``, ``fattree:radix=32``; default ``switch``),
``COMMPRESS_TUNE_LINK`` (``100gbit``), ``COMMPRESS_TUNE_FIT`` (a fit saved by
``commpress sim --calibrate ... --save-fit``; default: the model's defaults),
``COMMPRESS_TUNE_SHARED_CORES`` (all hosts on one machine of that many cores: the emulated
cluster) and ``COMMPRESS_TUNE_ALGORITHMS`` (candidates, comma-separated). A multicast is
timed at the pace of the group's own multicast options (rate, roots, racks, uplink:
:func:`commpress.transport.multicast.options_of`), as its transport runs it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import os
import threading

import torch

from commpress.codecs import get_codec
from commpress.schedules.error_growth import error_growth
from commpress.schedules.payloads import REDUCTION_DTYPES
from commpress.schedules.registry import (
    ERROR_FEEDBACK_ALGORITHMS,
    NATIVE,
    algorithms,
    every_algorithm,
    get_algorithm,
    plan,
    same_result_on_every_rank,
)
from commpress.sim import calibrate
from commpress.sim.model import Params, simulate
from commpress.sim.topology import check_topology, parse_topology
from commpress.spec_options import parse_options, split_spec
from commpress.transport.reliable_broadcast import Options
from commpress.units import counted, parse_rate_bits

AUTO = "auto"
#: The error budget of ``codec="auto"`` without one, and of ``fsdp.compress(..., "auto")``.
DEFAULT_MAX_REL_ERR = 1e-2
CANDIDATE_CODECS = ("none", "bf16", "fp16", "int8", "int4", "fp8")
#: ring-hop is the baseline a ring beats; multicast needs a network that routes it.
DEFAULT_ALGORITHMS = (NATIVE, "ring", "backend", "alltoall")
_SAMPLE_NUMEL, _SAMPLE_SEED = 1 << 16, 1234

logger = logging.getLogger("commpress.tuner")


@dataclasses.dataclass(frozen=True)
class Network:
    """What the tuner assumes the ranks are connected by."""

    topology: str = "switch"
    link: str = "100gbit"
    fit: str | None = None
    shared_cores: int | None = None
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS

    def __post_init__(self):
        # a set's order follows the hash seed, and ties go to the first listed: ranks
        # would choose differently
        if isinstance(self.algorithms, (str, set, frozenset)):
            raise TypeError(f"tuner algorithms must be a list of names, got {self.algorithms!r}")
        # a list would leave the network unhashable: it keys the cached choices and fits
        object.__setattr__(self, "algorithms", tuple(self.algorithms))
        check_topology(self.topology)
        parse_rate_bits(self.link, "tuner link")
        if self.shared_cores is not None and (
            isinstance(self.shared_cores, bool)
            or not isinstance(self.shared_cores, int)
            or self.shared_cores < 1
        ):
            raise ValueError(f"shared_cores must be a positive int, got {self.shared_cores!r}")
        unknown = [name for name in self.algorithms if name not in every_algorithm()]
        if unknown or not self.algorithms:
            raise ValueError(
                f"tuner algorithms {list(self.algorithms)}: unknown {unknown}; choose from "
                f"{list(every_algorithm())}"
            )
        if self.fit is not None:
            calibrate.load(self.fit)  # a bad file is named here, not in the first collective


@dataclasses.dataclass(frozen=True)
class Choice:
    algorithm: str
    codec: str
    predicted_us: float

    def __str__(self) -> str:
        return f"{self.codec}@{self.algorithm}"


_lock = threading.Lock()
_network: Network | None = None
_configured: Network | None = None  # what configure() set, by value
#: How many calls' choices are kept; past that the least recently used is dropped (and
#: timed again if asked for): calls of ever new sizes would otherwise grow it for good.
KEPT_MODEL_CHOICES = 4096
_choices: collections.OrderedDict = collections.OrderedDict()
_warned: set = set()
_errors: dict[str, float] = {}


def configure(**fields) -> Network:
    """Set the network the tuner plans for (fields of :class:`Network`); forgets every
    cached choice and rereads the fit. Call it with the same values on every rank. Choices
    already agreed over a group (:mod:`commpress.collectives.auto`) are kept while the
    values stay the same: a fit rewritten at the same path counts for new call shapes only."""
    global _network, _configured
    network = Network(**fields)
    with _lock:
        _network = _configured = network
        _choices.clear()
        _warned.clear()
        _params.cache_clear()  # the fit file may have been rewritten since
    return network


def _check_request(op: str, codec, algorithm: str) -> None:
    """Refuse what no world size can run, on a world of one too (which runs torch's
    collective whatever was asked)."""
    if is_auto(codec):
        budget(codec)
    if algorithm not in (AUTO, NATIVE):
        get_algorithm(algorithm, op)


def _check_codec_takes(op, dtype, codec, algorithm, setting, argument: str) -> None:
    """A codec the caller fixed (or one of an auto codec's candidates) is what every
    compressed algorithm the call may be given encodes with, so it must take ``dtype``, on
    a world of one too: torch's own collective, which ignores it, is no way around that,
    save for a reduction that only torch may run."""
    if not _may_compress(op, dtype, algorithm, setting):
        return
    if not is_auto(codec):
        get_codec(codec).check_dtype(dtype, argument)
    elif not any(_usable(spec, dtype) for spec in budget(codec)[1]):
        raise ValueError(
            f"codec {codec!r}: none of {list(budget(codec)[1])} encodes {argument}={dtype}"
        )


def _may_compress(op: str, dtype: torch.dtype, algorithm: str, setting: Network) -> bool:
    if algorithm != AUTO:
        return algorithm != NATIVE
    if op == "reduce_scatter" and dtype not in REDUCTION_DTYPES:
        return False
    return any(name != NATIVE and name in algorithms(op) for name in setting.algorithms)


def _warn_once_of_another_backend(setting: Network, backend: str, on_cpu: bool) -> None:
    """A fit is made from ``commpress bench`` rows, which run on gloo: its efficiencies
    (the two-rank exchanges' above all) describe gloo, not another backend. A group of
    several backends ("cpu:gloo,cuda:nccl") moves CPU tensors with gloo."""
    if setting.fit is None or backend == "gloo" or (on_cpu and "gloo" in backend):
        return
    with _lock:
        if (setting.fit, backend) in _warned:
            return
        _warned.add((setting.fit, backend))
    logger.warning(
        "the tuner's fit %s was measured on gloo (`commpress bench` runs on gloo); on %s "
        "its link efficiencies, the two-rank exchanges' above all, may not hold",
        setting.fit, backend,
    )  # fmt: skip


def configured() -> Network | None:
    """The network :func:`configure` set last (None where it has not been called): what
    every rank is told alike, in code, unlike the environment one rank reads."""
    return _configured


def network() -> Network:
    """The configured network, or the one the environment describes."""
    global _network
    with _lock:
        if _network is None:
            _network = _from_environment()
        return _network


def is_auto(codec) -> bool:
    return isinstance(codec, str) and split_spec(codec)[0] == AUTO


def choose(
    op: str,
    numel: int,
    dtype: torch.dtype,
    world_size: int,
    codec="none",
    algorithm: str = AUTO,
    *,
    on_cpu: bool = True,
    backend: str = "gloo",
    error_feedback: bool = False,
    chunk_bytes: int | None = None,
    placement: Placement | None = None,
    multicast: Options | None = None,
    argument: str = "dtype",
) -> Choice:
    """The fastest (algorithm, codec) for one call; ``numel`` is the rank's input (an
    all-gather's shard, a reduce-scatter's whole tensor). ``codec`` and ``algorithm`` may
    each be fixed or ``auto``. ``error_feedback``: only algorithms that round every
    contribution on its owner (``alltoall``, ``backend``) qualify. ``chunk_bytes``: the
    pieces a ring reduce-scatter pipelines, as the call will run it (default the
    collective's). ``placement``: where a subgroup's ranks sit in the network (default:
    ranks 0 to ``world_size - 1`` of a network of ``world_size`` hosts). ``multicast``: the
    options the group's multicast transport paces with
    (:func:`commpress.transport.multicast.options_of`; default: paced for the tuner's
    network). ``argument``: what a refusal of the dtype calls it."""
    if op not in ("all_gather", "reduce_scatter"):
        raise ValueError(f"algorithm/codec 'auto' is for all_gather and reduce_scatter, not {op}")
    _check_request(op, codec, algorithm)
    request = (str(codec) if is_auto(codec) else str(get_codec(codec)), algorithm)
    # the network in the key: a choice made while configure() replaced it on another
    # thread is stored under the old network's key, never served under the new one
    setting = network()
    key = (op, numel, dtype, world_size, backend, on_cpu, error_feedback, chunk_bytes,
           placement, multicast, request, setting)  # fmt: skip
    found = _recalled(key)
    if found is not None:
        return found
    _check_codec_takes(op, dtype, codec, algorithm, setting, argument)
    # refused alone as on more ranks, where torch's collective would do: a program tried
    # on one rank must not fail at scale
    pairs = _eligible(
        op, dtype, world_size, codec, algorithm, setting, on_cpu, backend, error_feedback
    )
    alone = world_size == 1
    if alone and _left_to_torch_alone(algorithm, error_feedback, dtype, backend, on_cpu):
        return Choice(NATIVE, "none", 0.0)
    _warn_once_of_another_backend(setting, backend, on_cpu)
    if alone:  # the most accurate pair that may run it
        name, spec = min(pairs, key=lambda pair: expected_rel_err(pair[1], op, pair[0], 1, dtype))
        return Choice(name, spec, 0.0)
    # an empty call is planned as the smallest one (one element per rank: a schedule of no
    # bytes is none the model reads), so that error feedback and a fixed algorithm hold
    planned = numel or (world_size if op == "reduce_scatter" else 1)
    size = planned * dtype.itemsize * (world_size if op == "all_gather" else 1)
    params = _params(setting)
    topology = _topology(setting, world_size, placement)
    timed = []
    for name, spec in pairs:
        try:
            row = simulate(op, name, spec, size, topology, params, dtype, chunk_bytes, multicast)
            error = expected_rel_err(spec, op, name, world_size, dtype)
        except ValueError:  # a fit without this algorithm, a schedule it cannot read
            continue
        # ties (the model has exact ones: native is the uncompressed ring) go to the more
        # accurate codec, then to torch's own collective, then to the order of the list
        preference = (error, name != NATIVE, setting.algorithms.index(name)
                      if name in setting.algorithms else len(setting.algorithms))  # fmt: skip
        timed.append((row.time_us, preference, name, spec))
    if not timed:
        raise ValueError(
            f"the tuner's fit ({setting.fit}) times none of {sorted({n for n, _ in pairs})} "
            f"for {op}: "
            "calibrate it with `commpress bench` rows of them"
        )
    time_us, _, name, spec = min(timed)
    choice = Choice(name, spec, time_us)
    _remember(key, choice)
    logger.info(
        "%s of %d %s elements on %d ranks (%s, %s): %s, %.0f us predicted",
        op, numel, str(dtype).removeprefix("torch."), world_size, setting.topology,
        setting.link, choice, time_us,
    )  # fmt: skip
    return choice


def _left_to_torch_alone(algorithm, error_feedback, dtype, backend, on_cpu) -> bool:
    """Whether a world of one runs torch's own collective, which copies exactly (nothing
    moves): where the call leaves the algorithm to the tuner, asks for no error feedback
    (which torch's does not do) and is of a dtype torch takes."""
    chosen_here = algorithm in (AUTO, NATIVE)
    return chosen_here and not error_feedback and torch_moves(dtype, backend, on_cpu)


def _recalled(key) -> Choice | None:
    with _lock:
        found = _choices.get(key)
        if found is not None:
            _choices.move_to_end(key)
    return found


def _remember(key, choice: Choice) -> None:
    with _lock:
        _choices[key] = choice
        while len(_choices) > KEPT_MODEL_CHOICES:
            _choices.popitem(last=False)


def check(
    op: str,
    dtype: torch.dtype,
    world_size: int,
    codec,
    algorithm: str = AUTO,
    *,
    on_cpu: bool = True,
    backend: str = "gloo",
    error_feedback: bool = False,
    placement: Placement | None = None,
) -> None:
    """Raise the ``ValueError`` :func:`choose` would raise for the calls of ``op`` on
    ``dtype`` on this group at any size (no codec within the budget, no candidate), timing
    nothing: for a wrapper that knows its calls' dtype and group before the first one."""
    _check_request(op, codec, algorithm)
    setting = network()
    if is_auto(codec):  # a codec given is the caller's to check, naming what it is given
        _check_codec_takes(op, dtype, codec, algorithm, setting, "dtype")
    _eligible(op, dtype, world_size, codec, algorithm, setting, on_cpu, backend, error_feedback)
    if world_size > 1:
        _topology(setting, world_size, placement)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a subgroup's ranks sit: rank r on host ``hosts[r]`` of a network of
    ``network_hosts`` (one rank per host: the hosts are the ranks' global ranks)."""

    hosts: tuple[int, ...]
    network_hosts: int


def _topology(setting, world_size: int, placement: Placement | None = None):
    """The network the tuner assumes, with a group of ``world_size`` ranks on hosts 0 to
    ``world_size - 1`` of it, or as ``placement`` says."""
    link_bits = parse_rate_bits(setting.link, "link")
    try:
        if placement is None:
            return parse_topology(setting.topology, world_size, link_bits)
        whole = parse_topology(setting.topology, placement.network_hosts, link_bits)
        return whole.placed(placement.hosts)
    except ValueError as error:
        on = "" if placement is None else f" on hosts {list(placement.hosts)}"
        raise ValueError(
            f"the tuner's network ({setting.topology}, set with commpress.sim.tuner.configure) "
            f"does not fit a group of {counted(world_size, 'rank')}{on}: {error}"
        ) from None


def _eligible(
    op, dtype, world_size, codec, algorithm, setting, on_cpu, backend, error_feedback
) -> list[tuple[str, str]]:
    """The (algorithm, codec) pairs a call may run: :func:`_candidates`, and with error
    feedback only the algorithms that round every contribution on its owner."""
    pairs = _candidates(op, dtype, world_size, codec, algorithm, setting, on_cpu, backend)
    if error_feedback:
        kept = [(name, spec) for name, spec in pairs if name in ERROR_FEEDBACK_ALGORITHMS]
        if not kept:
            raise ValueError(
                f"error feedback needs one of {ERROR_FEEDBACK_ALGORITHMS} among the tuner's "
                f"candidates for this call, which are {list(dict.fromkeys(n for n, _ in pairs))}"
                + _why_native_only(op, dtype)
            )
        pairs = kept
    return pairs


def _why_native_only(op: str, dtype: torch.dtype) -> str:
    if op == "reduce_scatter" and dtype not in REDUCTION_DTYPES:
        return f" (a compressed reduction sums in float32, which cannot hold {dtype} exactly)"
    return ""


def measured_rel_err(codec, dtype: torch.dtype = torch.float32) -> float:
    """``codec``'s relative error on a fixed Gaussian sample of ``dtype``, measured once.

    A codec that rounds stochastically is measured rounding to nearest, times sqrt(2) (a
    value a fraction ``p`` of a step from its lower grid point errs by ``p(1 - p)`` steps
    squared on average, 1/6 for uniform ``p``, against 1/12): its noise differs between
    ranks, and so would its measured error, and the choices made from it."""
    spec = str(get_codec(codec))
    with _lock:
        found = _errors.get((spec, dtype))
    if found is None:
        generator = torch.Generator().manual_seed(_SAMPLE_SEED)
        # the dtype's values held in fp32 and the result rounded to the dtype: the codecs'
        # fp32 kernels, no first-call compilation of a 16-bit path on this CPU
        sample = torch.randn(_SAMPLE_NUMEL, generator=generator).to(dtype).float()
        chosen, scale = get_codec(spec), 1.0
        if getattr(chosen, "stochastic", False):
            chosen, scale = dataclasses.replace(chosen, stochastic=False), math.sqrt(2)
        decoded = chosen.decode(chosen.encode(sample), sample.numel(), torch.float32)
        decoded, exact = decoded.to(dtype).double(), sample.double()
        found = scale * ((decoded - exact).norm() / exact.norm()).item()
        with _lock:
            _errors[spec, dtype] = found
    return found


def expected_rel_err(
    codec, op: str, algorithm: str, world_size: int, dtype: torch.dtype = torch.float32
) -> float:
    """``codec``'s expected relative error in the result of ``op`` by ``algorithm`` on
    ``world_size`` ranks of ``dtype`` input: one encode's (:func:`measured_rel_err`) times
    its growth along the schedule, for independent contributions of equal norm
    (``native``: exact). Not counted: a lossless codec's ring reduce-scatter of 16-bit
    input rounds each partial sum to that dtype, as torch's own does."""
    if algorithm == NATIVE:
        return 0.0
    spec = str(get_codec(codec))
    once = measured_rel_err(spec, dtype)
    return once * _growth(op, algorithm, world_size, spec) if once else 0.0


@functools.lru_cache(maxsize=256)
def _growth(op: str, algorithm: str, world_size: int, spec: str) -> float:
    codec = get_codec(spec)
    numel = world_size if op == "reduce_scatter" else 1  # the growth does not depend on it
    (schedule,) = plan(op, algorithm, 0, world_size, numel, torch.float32, codec)
    return error_growth(schedule, codec.idempotent)


def budget(codec: str) -> tuple[float, tuple[str, ...]]:
    """``(max_rel_err, candidate codecs)`` of an ``auto[:max_rel_err=E][,codecs=a+b]`` spec."""
    _, text = split_spec(codec)
    options = parse_options(text, {"max_rel_err": float, "codecs": str}, codec, "codec 'auto'")
    limit = options.get("max_rel_err", DEFAULT_MAX_REL_ERR)
    if not limit >= 0:  # NaN too
        raise ValueError(f"codec {codec!r}: max_rel_err must be at least 0")
    names = CANDIDATE_CODECS
    if "codecs" in options:
        names = tuple(filter(None, (name.strip() for name in options["codecs"].split("+"))))
        if not names:
            raise ValueError(f"codec {codec!r}: codecs= names no codec (codecs=int8+int4)")
        for name in names:
            get_codec(name)  # an unknown codec is named here
    return limit, names


def _candidates(
    op, dtype, world_size, codec, algorithm, setting, on_cpu, backend
) -> list[tuple[str, str]]:
    if algorithm == AUTO:
        names = [a for a in setting.algorithms if a in algorithms(op)]
        if op == "reduce_scatter" and dtype not in REDUCTION_DTYPES:
            names = _native_only(names, op, dtype)
    else:
        names = [algorithm]
    limit, specs = budget(codec) if is_auto(codec) else (None, (str(get_codec(codec)),))
    if limit is not None:  # none left only where no compressed algorithm may run the call
        specs = tuple(s for s in specs if _usable(s, dtype))
    pairs, too_inexact = [], []
    for name in names:
        if name == NATIVE and not torch_moves(dtype, backend, on_cpu):
            continue
        moves_host_memory = name != NATIVE and get_algorithm(name, op).host_transport
        if moves_host_memory and "nccl" in backend:  # as collectives.checks.check_device
            continue
        for spec in ["none"] if name == NATIVE else specs:
            if op == "all_gather" and not same_result_on_every_rank(get_codec(spec), name):
                continue
            if limit is not None:
                try:
                    error = expected_rel_err(spec, op, name, world_size, dtype)
                except ValueError:  # a schedule the error model cannot read
                    continue
                if error > limit:
                    too_inexact.append((error, spec, name))
                    continue
            pairs.append((name, spec))
    if too_inexact and all(name == NATIVE for name, _ in pairs):  # native has no codec
        error, spec, name = min(too_inexact)
        raise ValueError(
            f"codec {codec!r}: no codec of {list(budget(codec)[1])} is within max_rel_err="
            f"{limit} for {op} of {dtype} on {counted(world_size, 'rank')} by "
            f"{[name for name in names if name != NATIVE]} (the closest, "
            f"{spec}@{name}, errs {error:.3g})"
        )
    if not pairs:
        unmoved = "" if torch_moves(dtype, backend, on_cpu) else f"; gloo moves no {dtype}"
        raise ValueError(
            f"no algorithm of {names} runs {op} with codec {codec!r} on this group "
            f"({'CPU' if on_cpu else 'GPU'} tensors, {backend}{unmoved})"
        )
    return pairs


#: The dtypes torch's gloo collectives take (ProcessGroupGloo's GENERATE_ALL_TYPES in
#: torch 2.13, a C++ switch torch does not expose; tests/unit/test_tuner.py asks gloo
#: itself; a complex tensor travels as its real view): any other, such as int16, uint32 or
#: float8, is "Invalid scalar type", which the compressed algorithms move.
GLOO_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
     torch.bool, torch.int32, torch.int64}
)  # fmt: skip


def torch_moves(dtype: torch.dtype, backend: str, on_cpu: bool) -> bool:
    """Whether torch's own collective (``native``) on a ``backend`` group takes ``dtype``
    (gloo's carries CPU tensors, and CUDA tensors on a group of gloo alone)."""
    if not (backend == "gloo" or (on_cpu and "gloo" in backend)):
        return True
    return (dtype.to_real() if dtype.is_complex else dtype) in GLOO_DTYPES


def _native_only(names: list[str], op: str, dtype: torch.dtype) -> list[str]:
    """A compressed reduction sums in fp32, which cannot hold ``dtype`` exactly: only torch's
    own collective may reduce it."""
    if NATIVE not in names:
        raise ValueError(
            f"{op} of {dtype}: compressed reductions accumulate in float32, which cannot hold "
            f"{dtype} exactly, so only 'native' may run it, and the tuner's algorithms "
            f"{names} leave it out"
        )
    return [NATIVE]


def _usable(spec: str, dtype: torch.dtype) -> bool:
    try:
        get_codec(spec).check_dtype(dtype, "dtype")
    except (TypeError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=8)  # a fit file is read once per network, not per call shape
def _params(setting: Network) -> Params:
    fields = calibrate.load(setting.fit) if setting.fit else {}
    return Params(**fields, shared_cores=setting.shared_cores)


def _from_environment() -> Network:
    fields = {}
    for key, name in (("topology", "TOPOLOGY"), ("link", "LINK"), ("fit", "FIT")):
        value = os.environ.get(f"COMMPRESS_TUNE_{name}")
        if value:
            fields[key] = value
    cores = os.environ.get("COMMPRESS_TUNE_SHARED_CORES")
    if cores:
        if not cores.strip().isdigit():
            raise ValueError(f"COMMPRESS_TUNE_SHARED_CORES={cores!r}: a positive integer")
        fields["shared_cores"] = int(cores)
    chosen = os.environ.get("COMMPRESS_TUNE_ALGORITHMS")
    if chosen:
        fields["algorithms"] = tuple(a.strip() for a in chosen.split(",") if a.strip())
    try:
        return Network(**fields)
    except ValueError as error:
        raise ValueError(f"the COMMPRESS_TUNE_* environment: {error}") from None
