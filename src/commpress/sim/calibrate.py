"""Fit the cost model to our own measurements.

The model's time is, but for the overlap of codec work with transfers, piecewise linear in
its unknowns per algorithm, the time per message ``m`` and per call ``c`` (each at least
0) and the inverse of each level's link efficiency (each efficiency at most 1):
``T = m * messages + c + max(host_s / e, uplink_s / e_uplink, exchange_s / e_exchange) +
codec_s`` (``exchange_s``: host links in steps where each rank exchanges with a single
peer, as every step on two ranks does). For every measured row (``commpress bench
--json``) the terms are read off the model itself (run with ``m = c = 0`` and full
efficiency, then with ``m``, ``c`` and each level's efficiency moved one at a time), so the
fit and the predictions use one formula. ``c`` is fitted where an algorithm's rows span
two world sizes or more, and are more than :data:`MIN_ROWS`; else it stays 0 (at one
world size, most schedules send as many messages a call at every size, and ``c`` could
not be told from ``m``). Where the rows span few world sizes, ``m`` and ``c`` trade
against each other: the fit gives the measured world sizes back, but a projection far
beyond them follows the split (``fit(..., per_call=False)``, ``commpress sim
--no-call-time``, fits none). A row's transfer time counts toward the level
that bounds it; the uplinks and the exchanges get an efficiency of their own where at
least two rows of an algorithm are bound by them and two by the rest. ``m``, ``c`` and the
efficiencies are fitted per op and algorithm by least squares on the relative error (a
1 MiB row counts as much as a 64 MiB one), then refined by Gauss-Newton steps on the model
itself (where codec work hides transfers the time is not linear in ``1/e``), each kept only
if it lowers the error. Where every host of a measurement shared one machine (the emulated
cluster: the file's provenance names its cores), per-message, per-call and codec work are
scaled by hosts per core; codec speeds come from ``commpress codecs --json``.

A fit is saved as JSON: ``{"format": "commpress-sim-fit", "version": 3, "message_s":
{"op/algorithm": s}, "call_s": {"op/algorithm": s}, "efficiency": {"op/algorithm": e},
"uplink_efficiency": {"op/algorithm": e}, "exchange_efficiency": {"op/algorithm": e},
"codec_bytes_per_s": {codec: [enc, dec]}}`` (``call_s`` only where fitted above 0,
``uplink_efficiency`` and ``exchange_efficiency`` only for the algorithms fitted on those
levels apart; all three optional); its per-message and per-call times are those of a host
with a core of its own.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import warnings
from pathlib import Path

import numpy as np
import torch

from commpress.codecs import get_codec
from commpress.schedules import input_numel
from commpress.schedules.registry import NATIVE, get_algorithm
from commpress.sim.model import LEVEL_EFFICIENCIES as LEVELS
from commpress.sim.model import OPTIONAL_EFFICIENCIES, Params, simulate
from commpress.sim.topology import Racks, Switch, Topology
from commpress.units import DTYPES, check_racks, counted, parse_rate_bits, torch_dtype

FORMAT, VERSION = "commpress-sim-fit", 3
#: Versions :func:`load` reads: 1 had no ``exchange_efficiency``, 2 no ``call_s`` (code that
#: reads an older version only would drop them silently, so a newer one refuses to load
#: there).
READABLE_VERSIONS = (1, 2, 3)
_BENCH_KEYS = ("op", "algorithm", "codec", "size_bytes", "time_us", "nprocs", "link")
_PROBE_S = 1e-3  # the message time used to read a row's message count off the model
#: Rows per op and algorithm a fit needs: two unknowns, more with levels of their own (2
#: rows each); a time per call, one more unknown, is fitted from one more row.
MIN_ROWS = 3
# the unknowns of one op and algorithm, in this order: per message, per call, 1 / the host
# links' efficiency, then 1 / each other level's fitted on its own
_M, _C, _HOST = 0, 1, 2
_SLOW = 1e-6  # a level's efficiency that makes it the bound of every step
_ROUNDS = 8  # at most, of assigning rows to the level that bounds them, then fitting again
_STEPS = 20  # at most, of Gauss-Newton on the model itself after the linear fit


@dataclasses.dataclass(frozen=True)
class Measured:
    """One ``commpress bench`` row, with the topology it ran on."""

    op: str
    algorithm: str
    codec: str
    size_bytes: int
    time_s: float
    topology: Topology
    source: str
    roots: int = 2  # multicast K, from the command that measured the row
    shared_cores: int | None = None  # the emulated cluster's: every host on one machine
    machine: str = ""  # as the file's provenance names it: fit one machine at a time
    dtype: torch.dtype = torch.float32  # the row's ``type``: its element count, its payloads

    @classmethod
    def of(cls, row: dict, source: str, roots=2, shared_cores=None, machine="") -> Measured:
        missing = [key for key in _BENCH_KEYS if key not in row]
        if missing == ["link"]:  # local processes: no link the model could time
            raise ValueError(
                "a `commpress bench` row of local processes (no link rate): calibrate with "
                "rows measured on the emulated cluster (`commpress bench --hosts N --link R`)"
            )
        if missing:
            raise ValueError(f"a row lacks {missing}: not a `commpress bench` row")
        get_codec(row["codec"])  # an unknown codec is named with its file and row
        if row["algorithm"] != NATIVE:
            get_algorithm(row["algorithm"], row["op"])  # so is an algorithm the op lacks
        nodes = _whole(row, "nprocs")
        size_bytes = _whole(row, "size_bytes")
        time_us = row["time_us"]
        if isinstance(time_us, bool) or not isinstance(time_us, (int, float)):
            raise TypeError(f"time_us must be a number, got {time_us!r}")
        if not 0 < time_us < math.inf:
            raise ValueError(f"time_us must be positive and finite, got {time_us!r}")
        link_bits = parse_rate_bits(str(row["link"]).split(",")[0], "link")
        racks = check_racks(_whole(row, "racks"), nodes) if row.get("racks") is not None else 1
        if racks > 1:
            uplink = row.get("uplink")
            uplink_bits = link_bits if uplink is None else parse_rate_bits(uplink, "uplink")
            topology: Topology = Racks(nodes, link_bits, racks, uplink_bits)
        else:
            topology = Switch(nodes, link_bits)
        dtype = _row_dtype(row)
        if input_numel(row["op"], size_bytes, nodes, dtype) < 1:
            raise ValueError(
                f"size_bytes {size_bytes} holds no {str(dtype).removeprefix('torch.')} element "
                "per rank"
            )
        return cls(row["op"], row["algorithm"], row["codec"], size_bytes, time_us * 1e-6,
                   topology, source, roots, shared_cores, machine, dtype)  # fmt: skip


def _whole(row: dict, key: str) -> int:
    """``row[key]``, a whole number (``4.0`` is 4; ``4.7`` is refused, not read as 4)."""
    value = row[key]
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    return int(value)


def _row_dtype(row: dict) -> torch.dtype:
    """The torch dtype of ``row["type"]`` (``float`` where it has none)."""
    name = row.get("type", "float")
    if not isinstance(name, str) or name not in DTYPES:
        raise ValueError(f"type must be one of {list(DTYPES)}, got {name!r}")
    return torch_dtype(name)


def read_bench(paths) -> list[Measured]:
    """Every all-gather and reduce-scatter row of the given ``commpress bench`` JSON files."""
    rows, tuned_rows = [], 0
    for path in paths:
        data = _json(path)
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError(f"{path}: not a `commpress bench --json` file (no 'rows' list)")
        if not isinstance(data.get("provenance") or {}, dict):
            raise ValueError(f"{path}: provenance must be an object")
        provenance = data.get("provenance") or {}
        command, machine = provenance.get("command", ""), provenance.get("machine", "")
        if not (isinstance(command, str) and isinstance(machine, str)):
            raise ValueError(f"{path}: provenance must map 'command' and 'machine' to strings")
        roots = _roots(command, path)
        cores = _cores(machine)
        for index, row in enumerate(data["rows"]):
            if not isinstance(row, dict) or row.get("op") not in ("all_gather", "reduce_scatter"):
                continue
            tuned = row.get("algorithm") == "auto" or str(row.get("codec")).startswith("auto")
            if tuned:  # the tuner's pick: measured in its own row
                tuned_rows += 1
                continue
            try:
                measured = Measured.of(row, str(path), roots, cores, machine)
            except (TypeError, ValueError) as error:
                raise ValueError(f"{path}: row {index}: {error}") from None
            rows.append(measured)
    if not rows:
        tuned = (
            f" of a fixed algorithm and codec (only {counted(tuned_rows, 'row')} of the "
            "tuner's, algorithm or codec auto, which a fit cannot read)"
            if tuned_rows
            else ""
        )
        raise ValueError(
            f"no all_gather or reduce_scatter rows{tuned} in {', '.join(map(str, paths))}"
        )
    return rows


def codec_speeds(path) -> dict:
    """codec -> (encode, decode) bytes of input per second, from ``commpress codecs --json``."""
    data = _json(path)
    rows = data.get("rows") if isinstance(data, dict) else None
    keys = ("codec", "encode_gbps", "decode_gbps")
    if not rows or not all(isinstance(r, dict) and all(k in r for k in keys) for r in rows):
        raise ValueError(
            f"{path}: not a `commpress codecs --json` file (rows with codec, encode_gbps, "
            "decode_gbps)"
        )
    speeds, first_row = {}, {}  # first_row: canonical spec -> (row index, spec as given)
    for index, row in enumerate(rows):
        both = row["encode_gbps"], row["decode_gbps"]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in both)
        if not (numbers and all(0 < v < math.inf for v in both)):  # true is not 1 GB/s
            raise ValueError(
                f"{path}: row {index}: encode_gbps and decode_gbps must be positive numbers, "
                f"got {both}"
            )
        spec = row["codec"]
        if not isinstance(spec, str):
            raise ValueError(f"{path}: row {index}: codec must be a spec string")
        try:
            canonical = str(get_codec(spec))
        except ValueError as error:
            raise ValueError(f"{path}: row {index}: {error}") from None
        rates = (both[0] * 1e9, both[1] * 1e9)
        earlier, earlier_spec = first_row.setdefault(canonical, (index, spec))
        if speeds.get(earlier_spec, rates) != rates:
            raise ValueError(
                f"{path}: rows {earlier} ({earlier_spec!r}) and {index} ({spec!r}) give "
                f"{canonical} two speeds, {speeds[earlier_spec]} and {rates} bytes per second: "
                "keep one"
            )
        speeds[spec] = rates
    return speeds


#: The levels that may get an efficiency of their own, in the order a tie prefers them.
_OWN_CANDIDATES = tuple(level for level in LEVELS if level != "host")


def terms(row: Measured, params: Params) -> tuple[float, float, dict, float]:
    """``(messages, calls, level_s, codec_s)`` of ``row``: its time is about
    ``m * messages + c * calls + max(level_s[l] / e_l for each level l) + codec_s``, with
    each level's transfer time at its full rate (0 where the row has no such transfer);
    ``calls`` is 1, times the hosts per core where they share cores."""
    base = _unit(row, params)
    fixed = _time(row, base)
    messages = (_time(row, dataclasses.replace(base, message_s=_PROBE_S)) - fixed) / _PROBE_S
    calls = (_time(row, dataclasses.replace(base, call_s=_PROBE_S)) - fixed) / _PROBE_S
    level_s = {level: _level_s(row, base, field) for level, field in LEVELS.items()}
    return messages, calls, level_s, fixed - max(level_s.values())


def _level_s(row: Measured, base: Params, field: str) -> float:
    """One level's transfer time at its full rate: slowed to a tiny fraction of its rate,
    the level bounds every step, and its time grows as the inverse of that fraction.
    Where codec work would hide the transfer at real efficiencies, this overstates it."""
    slow = _time(row, dataclasses.replace(base, **{field: _SLOW}))
    slower = _time(row, dataclasses.replace(base, **{field: _SLOW / 2}))
    return (slower - slow) * _SLOW


def _unit(row: Measured, params: Params) -> Params:
    """``params`` with no per-message, per-call or latency time, every link at its full
    rate."""
    return dataclasses.replace(
        params, message_s=0.0, call_s=0.0, latency_s=0.0, **dict.fromkeys(LEVELS.values(), 1.0),
        concurrent_roots=row.roots, shared_cores=row.shared_cores,
    )  # fmt: skip


def _time(row: Measured, params: Params) -> float:
    return (
        simulate(
            row.op, row.algorithm, row.codec, row.size_bytes, row.topology, params, row.dtype
        ).time_us
        * 1e-6
    )


def fit(bench_paths, codecs_path=None, per_call: bool = True) -> dict:
    """Params fields fitted to the rows of ``bench_paths``, per algorithm; without
    ``per_call``, no time per call (the per-message time takes it in)."""
    speeds = codec_speeds(codecs_path) if codecs_path else {}
    return fit_rows(read_bench(bench_paths), speeds, per_call)


def fit_rows(rows: list[Measured], speeds: dict, per_call: bool = True) -> dict:
    """:func:`fit` on rows already read (codec speeds as :func:`codec_speeds` gives)."""
    params = Params(codec_bytes_per_s=speeds)
    machines = sorted({row.machine for row in rows})
    if len(machines) > 1:
        warnings.warn(
            f"commpress sim: fitting rows of {len(machines)} machines ({'; '.join(machines)}) "
            "together: links and CPUs differ between them, fit one at a time",
            stacklevel=2,
        )
    fitted = {field: {} for field in ("message_s", "call_s", *LEVELS.values())}
    for op, algorithm in sorted({(row.op, row.algorithm) for row in rows}):
        mine = [row for row in rows if (row.op, row.algorithm) == (op, algorithm)]
        sizes = len({row.size_bytes for row in mine})
        if len(mine) < MIN_ROWS or sizes < 2:
            warnings.warn(
                f"commpress sim: {op} {algorithm} has {counted(len(mine), 'row')} of "
                f"{counted(sizes, 'size')}; a fit needs {MIN_ROWS} of two "
                "sizes or more: left out of the fit",
                stacklevel=2,
            )
            continue
        key = f"{op}/{algorithm}"
        fitted["message_s"][key], call_s, efficiencies = _fit_one(mine, params, per_call)
        if call_s > 0:
            fitted["call_s"][key] = call_s
        for level, efficiency in efficiencies.items():
            fitted[LEVELS[level]][key] = efficiency
    return {
        **fitted,
        "latency_s": 0.0,  # inside the per-message time: one level, hosts one hop apart
        "codec_bytes_per_s": speeds,
    }


def _fit_one(rows: list[Measured], params: Params, per_call: bool) -> tuple[float, float, dict]:
    """``(message_s, call_s, {level: efficiency})`` of one op and algorithm (``host``
    always, other levels where fitted on their own; ``call_s`` 0 unless ``per_call`` and
    the rows, more than :data:`MIN_ROWS`, span two world sizes or more).

    Each row's transfer time counts toward the level that bounds it: at first as at full
    efficiency (an uplink or exchange exactly as loaded as a host link counting as the
    bound), then as the fitted efficiencies say, until no row changes level; of the fits
    tried, the one whose predictions (the model's own) err least. A level other than the
    host links gets an efficiency of its own where two rows or more are bound by it and two
    or more by the rest; otherwise its rows count toward the host links'."""
    parts = [terms(row, params) for row in rows]
    spans = len({row.topology.ranks for row in rows}) >= 2
    per_call = per_call and spans and len(rows) > MIN_ROWS
    bounds = [_bound(level_s, {}) for _, _, level_s, _ in parts]
    best, best_own, best_error = None, (), np.inf
    for _ in range(_ROUNDS):
        own = _own_levels(bounds)
        matrix, target = [], []
        for row, (messages, calls, level_s, codec), bound in zip(rows, parts, bounds, strict=True):
            columns = [0.0] * (1 + len(own))
            columns[own.index(bound) + 1 if bound in own else 0] = level_s[bound]
            unknowns = [messages, calls if per_call else 0.0, *columns]
            matrix.append([u / row.time_s for u in unknowns])
            target.append((row.time_s - codec) / row.time_s)
        x = np.array(_least_squares(np.array(matrix), np.array(target)))
        error = np.sum(_residuals(rows, params, x, own) ** 2)
        if error < best_error:
            best, best_own, best_error = x, own, error
        again = [_bound(level_s, _efficiencies(x, own)) for _, _, level_s, _ in parts]
        if again == bounds:
            break
        bounds = again
    return _refine(rows, params, best, best_own, per_call)


def _bound(level_s: dict, efficiencies: dict) -> str:
    """The level whose time bounds a row at these efficiencies (1 where not given); on a
    tie, any level but the host links'."""
    times = {level: s / efficiencies.get(level, 1.0) for level, s in level_s.items() if s > 0}
    if not times:
        return "host"
    longest = max(times.values())
    preferred = (*_OWN_CANDIDATES, "host")
    return next(level for level in preferred if times.get(level) == longest)


def _own_levels(bounds: list[str]) -> tuple[str, ...]:
    """The levels other than the host links that get an efficiency of their own."""
    own: list[str] = []
    for level in _OWN_CANDIDATES:
        staying = sum(bounds.count(other) for other in LEVELS if other not in (level, *own))
        if bounds.count(level) >= 2 and staying >= 2:
            own.append(level)
    return tuple(own)


def _efficiencies(x: np.ndarray, own: tuple[str, ...]) -> dict:
    """``{level: efficiency}`` of ``x = [m, c, 1/e_host, 1/e_own...]``; every level not
    fitted on its own takes the host links'."""
    host = 1 / float(x[_HOST])
    mine = {level: 1 / float(x[_HOST + 1 + i]) for i, level in enumerate(own)}
    return {level: mine.get(level, host) for level in LEVELS}


def _refine(
    rows: list[Measured], params: Params, x: np.ndarray, own: tuple, per_call: bool
) -> tuple:
    """``(message_s, call_s, {level: efficiency})`` after Gauss-Newton steps on the model
    itself (``simulate``) from the linear fit ``x = [m, c, 1/e_host, 1/e_own...]``, each
    kept only if it lowers the sum of squared relative errors: the linear reading is exact
    where transfers set a row's time, not where codec work hides them. Without
    ``per_call``, ``c`` stays where it is (0)."""
    residuals = _residuals(rows, params, x, own)
    for _ in range(_STEPS):
        steps = np.maximum(np.abs(x), 1e-4) * 1e-6
        jacobian = np.column_stack([
            (_residuals(rows, params, x + np.eye(len(x))[j] * steps[j], own) - residuals)
            / steps[j]
            for j in range(len(x))
        ])  # fmt: skip
        if not per_call:
            jacobian[:, _C] = 0.0  # no step moves it: its least-squares share is 0
        target = np.array(_least_squares(jacobian, jacobian @ x - residuals))
        if np.allclose(target, x, rtol=1e-12, atol=0.0):
            break  # nowhere to go
        for fraction in 0.5 ** np.arange(12):  # the model has kinks: step back until better
            candidate = x + fraction * (target - x)  # inside the bounds, as x and target are
            moved = _residuals(rows, params, candidate, own)
            if np.sum(moved**2) < np.sum(residuals**2) * (1 - 1e-9):
                break
        else:
            break
        x, residuals = candidate, moved
    efficiencies = _efficiencies(x, own)
    chosen = {level: efficiencies[level] for level in ("host", *own)}
    return float(x[_M]), float(x[_C]), chosen


def _residuals(rows: list[Measured], params: Params, x: np.ndarray, own: tuple) -> np.ndarray:
    """Each row's relative error with ``x = [m, c, 1/e_host, 1/e_own...]`` (the levels not
    in ``own`` at the host links' efficiency)."""
    fields = {"message_s": max(float(x[_M]), 0.0), "call_s": max(float(x[_C]), 0.0)}
    fields["latency_s"] = 0.0
    fields |= {LEVELS[level]: e for level, e in _efficiencies(x, own).items()}
    errors = []
    for row in rows:
        mine = dataclasses.replace(
            params, **fields, concurrent_roots=row.roots, shared_cores=row.shared_cores
        )
        errors.append(_time(row, mine) / row.time_s - 1)
    return np.array(errors)


def _least_squares(matrix: np.ndarray, target: np.ndarray) -> list[float]:
    """``[m, c, 1/e, ...]`` that fit ``matrix @ x = target`` best with ``m, c >= 0`` and
    every efficiency at most 1 (``1/e >= 1``): the best of the unconstrained fits with each
    subset of the unknowns held at its bound (three to five unknowns: at most 32 fits)."""
    bounds = [0.0, 0.0] + [1.0] * (matrix.shape[1] - 2)
    best, best_residual = None, np.inf
    for held in itertools.product((False, True), repeat=matrix.shape[1]):
        x = np.array([bound if hold else 0.0 for bound, hold in zip(bounds, held, strict=True)])
        free = [j for j, hold in enumerate(held) if not hold]
        rest = target - matrix @ x
        if free:
            x[free], *_ = np.linalg.lstsq(matrix[:, free], rest, rcond=None)
        if all(x[j] >= bounds[j] - 1e-12 for j in range(len(x))):
            residual = float(np.sum((matrix @ x - target) ** 2))
            if residual < best_residual:
                best, best_residual = x, residual
    return [max(float(v), bound) for v, bound in zip(best, bounds, strict=True)]


def save(path, fields: dict) -> None:
    payload = {"format": FORMAT, "version": VERSION, **fields}
    payload["codec_bytes_per_s"] = {k: list(v) for k, v in fields["codec_bytes_per_s"].items()}
    Path(path).write_text(json.dumps(payload, indent=2))


def load(path) -> dict:
    data = _json(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a fit saved by `commpress sim --save-fit`")
    version = data.get("version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:  # true == 1
        raise ValueError(
            f"{path}: fit version {version}, this commpress reads "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    missing = [k for k in ("message_s", "efficiency", "codec_bytes_per_s") if k not in data]
    if missing:
        raise ValueError(f"{path}: the fit lacks {missing}")
    per_key = ("message_s", "call_s", "efficiency", *OPTIONAL_EFFICIENCIES)
    fields = {field: _read_field(path, data, field, _number) for field in per_key}
    try:
        fields["latency_s"] = _number(data.get("latency_s", 0.0))
    except ValueError as error:
        raise ValueError(f"{path}: a malformed fit: latency_s {error}") from None
    fields["codec_bytes_per_s"] = _read_field(path, data, "codec_bytes_per_s", _two_numbers)
    try:
        Params(**fields)  # ranges
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: a malformed fit ({error})") from None
    return fields


def _read_field(path, data: dict, field: str, convert) -> dict:
    """``data[field]`` (an object; none: empty), each value converted, or a ValueError naming
    the field of the fit at ``path``."""
    values = data.get(field, {})
    if not isinstance(values, dict):
        raise ValueError(f"{path}: a malformed fit: {field} must be an object, got {values!r}")
    converted = {}
    for key, value in values.items():
        try:
            converted[key] = convert(value)
        except ValueError as error:
            raise ValueError(f"{path}: a malformed fit: {field}[{key!r}] {error}") from None
    return converted


def _number(value) -> float:
    """A JSON number: not true or false (Python's 1 and 0), not a string of digits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number, got {value!r}")
    return float(value)


def _two_numbers(speeds) -> tuple[float, float]:
    """``[encode, decode]``: not a string of two characters, which unpacks as two."""
    if not isinstance(speeds, list) or len(speeds) != 2:
        raise ValueError(f"must be [encode, decode] bytes per second, got {speeds!r}")
    return _number(speeds[0]), _number(speeds[1])


def describe(fields: dict) -> str:
    parts = []
    for name in fields["message_s"]:
        others = [
            f"{level}s {fields[field][name]:.2f}"
            for level, field in LEVELS.items()
            if level != "host" and name in fields.get(field, {})
        ]
        call_s = fields.get("call_s", {}).get(name)
        per_call = f", {call_s * 1e6:.0f} us/call" if call_s else ""
        parts.append(
            f"{name}: {fields['message_s'][name] * 1e6:.0f} us/message{per_call}, "
            f"efficiency {fields['efficiency'][name]:.2f}"
            + (f" ({', '.join(others)})" if others else "")
        )
    return "; ".join(parts)


def _roots(command: str, path) -> int:
    """``--roots K`` (or ``--roots=K``) of the ``commpress bench`` command line a file
    records (default 2)."""
    words = command.replace("--roots=", "--roots ").split()
    for index, flag in enumerate(words):
        if flag == "--roots":
            value = words[index + 1] if index + 1 < len(words) else ""
            if not value.isdigit() or int(value) < 1:
                raise ValueError(
                    f"{path}: the recorded command's --roots {value!r} is not a positive integer"
                )
            return int(value)
    return 2


def _cores(machine: str) -> int | None:
    """The cores of the machine a file was measured on ("AMD EPYC, 2 cores, Linux")."""
    for part in machine.split(","):
        words = part.split()
        if len(words) == 2 and words[1] == "cores" and words[0].isdigit():
            return int(words[0])
    return None


def _json(path):
    try:
        return json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON: {error}") from None
    except UnicodeDecodeError as error:  # a picture, a gzipped file: name it, not the byte
        raise ValueError(
            f"{path} is not JSON: not UTF-8 text (byte {error.object[error.start]:#04x} at "
            f"{error.start})"
        ) from None
