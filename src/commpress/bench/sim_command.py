"""``commpress sim``: what the collectives would cost at a scale we cannot run.

Sweeps nodes x ops x algorithms x codecs x sizes x link rates through the cost model
(:mod:`commpress.sim`), which reads the runtime's own schedules, and prints a table
(``native`` once per size, whatever the codecs; pairs the collectives do not run are
skipped and named; sizes round down to whole elements split evenly over the nodes, and
each row gives the size that moves);
``--json`` and ``--markdown`` keep the rows, ``--plot`` draws time against nodes.
``--calibrate BENCH.json [...]`` fits the model's per-message time and link efficiency to
``commpress bench`` rows (and codec speeds to ``commpress codecs`` JSON) and saves the
fit with ``--save-fit``; ``--fit FILE`` reuses one.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

from commpress.bench import report
from commpress.bench.arguments import (
    byte_size,
    comma_list,
    input_path,
    naming,
    output_path,
    plot_path,
    positive_int,
    same_twice,
    spec_list,
)
from commpress.codecs import get_codec
from commpress.schedules.registry import (
    NATIVE,
    OPS,
    every_algorithm,
    get_algorithm,
    piece_transfers,
    plan,
    result_gather,
    same_result_on_every_rank,
)
from commpress.schedules.steps import Transport
from commpress.schedules.wire import input_numel
from commpress.sim import calibrate
from commpress.sim.model import OPTIONAL_EFFICIENCIES, Params, simulate
from commpress.sim.topology import Racks, Topology, check_topology, parse_topology
from commpress.units import check_racks, parse_rate_bits

#: The most nodes a row is modelled on: a ring on n nodes is planned as n - 1 steps of
#: about 1 KB each, which the plan cache keeps for every row (at 10**6 nodes, 1.6 GB and 40 s
#: a row; at 10**8, some 100 GB): as many as ``commpress schedule`` plans a rank's steps for.
MAX_NODES = 1 << 16
#: The most transfers a row's schedule of a pipelined reduction may hold (its n - 1 per piece
#: of 2 MiB of a chunk, each made before the row is timed, about 2 KB apiece: a 1024G
#: ring reduce-scatter on 1024 nodes holds some 520 000: 1.1 GB and 49 s in a bug hunt).
MAX_PIECE_TRANSFERS = 1 << 19
#: The most nodes an all-to-all exchange is modelled on: 4096 x 4095 flows take seconds
#: and about a gigabyte; the time and memory grow with the square of the nodes.
MAX_ALL_TO_ALL_NODES = 4096
#: The least efficiency and the longest time (in microseconds) an option may give: below
#: and above them, the times modelled leave the float range (an efficiency of 1e-320, a
#: subnormal, made every time infinite); a slower link is a slower --link.
MIN_EFFICIENCY = 1e-6
MAX_MICROSECONDS = 1e9
COLUMNS = (
    ("nodes", "nodes", "d"),
    ("op", "op", "s"),
    ("algorithm", "algorithm", "s"),
    ("codec", "codec", "s"),
    ("size_bytes", "size(B)", "d"),
    ("link", "link", "s"),
    ("time_us", "time(us)", ".1f"),
    ("tx_bytes_per_host", "tx/host(B)", "d"),
    ("fabric_bytes", "fabric(B)", ".4g"),
    ("busiest_link_bytes", "busiest(B)", ".4g"),
    ("bottleneck", "bottleneck", "s"),
)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--topology",
        default="switch",
        help="switch, racks:count=2,uplink=500mbit (count dividing every --nodes, as in "
        "`commpress cluster`), fattree:radix=32 (switch)",
    )
    parser.add_argument(
        "--nodes",
        type=_int_list,
        default=[8],
        help=f"comma list, at most {MAX_NODES}; at most {MAX_ALL_TO_ALL_NODES} for a "
        "reduce-scatter's all-to-all (alltoall, backend) (8)",
    )
    parser.add_argument(
        "--op",
        type=comma_list,
        default=["all_gather"],
        help="comma list of all_gather, reduce_scatter (all_gather)",
    )
    parser.add_argument(
        "--algorithm",
        type=comma_list,
        default=["ring"],
        help="native, ring, ring-hop, backend, alltoall, multicast (ring)",
    )
    parser.add_argument("--codec", type=spec_list, default=["none"], help="comma list (none)")
    parser.add_argument(
        "--size",
        type=_size_list,
        default=[64 << 20],
        help="bytes as nccl-tests count them, comma list, e.g. 1M,64M (64M)",
    )
    parser.add_argument(
        "--link", type=comma_list, default=["100gbit"], help="host link rates, comma list (100gbit)"
    )
    parser.add_argument("--latency-us", type=_microseconds, help="per link crossed (1)")
    parser.add_argument("--message-us", type=_microseconds, help="per message (10)")
    parser.add_argument("--call-us", type=_microseconds, help="per call, whatever its messages (0)")
    parser.add_argument("--efficiency", type=_fraction, help="fraction of link rate reached (1)")
    parser.add_argument(
        "--uplink-efficiency",
        type=_fraction,
        help="the same on the links above the hosts': uplinks, edge and core (--efficiency)",
    )
    parser.add_argument(
        "--exchange-efficiency",
        type=_fraction,
        help="the same on host links in steps where each rank exchanges with a single peer, "
        "as every step on two ranks does (--efficiency)",
    )
    parser.add_argument(
        "--roots",
        type=positive_int,
        help="multicast roots at once, K; a row of fewer --nodes has every node a root at once (2)",
    )
    parser.add_argument(
        "--shared-cores",
        type=positive_int,
        help="every host on one machine of this many cores (the emulated "
        "cluster): per-message, per-call and codec work scale with hosts per core",
    )
    parser.add_argument(
        "--codec-speeds",
        type=input_path,
        metavar="CODECS.json",
        help="encode/decode speeds from `commpress codecs --json`",
    )
    parser.add_argument(
        "--calibrate",
        nargs="+",
        type=input_path,
        metavar="BENCH.json",
        help="fit message time, call time and efficiency to `commpress bench --json` rows",
    )
    parser.add_argument(
        "--no-call-time",
        action="store_true",
        help="--calibrate fits no time per call (the time per message takes it in): "
        "steadier projections far beyond the world sizes measured",
    )
    parser.add_argument(
        "--save-fit", type=output_path, metavar="FIT.json", help="where --calibrate saves its fit"
    )
    parser.add_argument(
        "--fit", type=input_path, metavar="FIT.json", help="use a fit saved by --save-fit"
    )
    parser.add_argument(
        "--json", type=output_path, metavar="PATH", help="also write the rows as JSON"
    )
    parser.add_argument(
        "--markdown", type=output_path, metavar="PATH", help="also write the table as markdown"
    )
    parser.add_argument(
        "--plot", type=plot_path, metavar="PATH", help="time against nodes (needs matplotlib)"
    )
    # fmt: skip


def main(args) -> int:
    """Bad values raise ValueError: the command line prints it as a one-line error."""
    for op in args.op:
        if op not in OPS or op == "all_reduce":
            raise ValueError(f"--op {op!r}: choose from all_gather, reduce_scatter")
    if args.roots is not None and "multicast" not in args.algorithm:  # as bench refuses it
        raise ValueError(f"--roots {args.roots}: for --algorithm multicast, which is not simulated")
    if args.uplink_efficiency is not None and check_topology(args.topology)[0] == "switch":
        raise ValueError(
            "--uplink-efficiency: for the links above the hosts', which --topology switch "
            "has none of"
        )
    for codec in args.codec:
        naming("--codec", get_codec, codec)
    for option, meaning in (
        ("--link", lambda link: parse_rate_bits(link, "--link")),
        ("--codec", lambda codec: str(get_codec(codec))),
    ):
        repeated = same_twice(getattr(args, option[2:]), meaning)
        if repeated:
            raise ValueError(f"{option}: {repeated} are the same, which would repeat rows")
    _check_all_to_all_nodes(args)
    params = _params(args)
    rows, skipped = [], set()
    for nodes, link, op, algorithm, codec, size in itertools.product(
        args.nodes, args.link, args.op, args.algorithm, args.codec, args.size
    ):
        if algorithm != NATIVE and not get_algorithm_or_none(algorithm, op):
            skipped.add(f"{algorithm} has no {op}")
            continue
        gathers = result_gather(op, algorithm)
        if gathers is not None and not same_result_on_every_rank(get_codec(codec), gathers):
            skipped.add(f"{algorithm} re-encodes at every hop, and {codec} is not idempotent")
            continue
        if algorithm == NATIVE and codec != args.codec[0]:
            continue  # native ignores the codec: one row
        topology = parse_topology(args.topology, nodes, parse_rate_bits(link, "--link"))
        _check_racks_hold_as_many(topology, args.topology)
        _check_pieces(op, algorithm, nodes, size)
        with np.errstate(over="ignore"):  # an overflow is refused just below, by name
            row = simulate(op, algorithm, codec, size, topology, params).as_dict()
        if not math.isfinite(row["time_us"]):  # a fit's values have no floor of their own
            raise ValueError(
                f"the modelled time of {op} {algorithm} {codec} {size_label(size)} on {nodes} "
                f"nodes at {link} is not finite: the efficiencies are too small or the times "
                f"too long (--fit, --efficiency, --latency-us, --message-us, --call-us)"
            )
        row.update(link=link, asked_bytes=size)  # size_bytes moved: it varies with nodes
        rows.append(row)
    if not rows:
        raise ValueError(f"nothing to simulate: {'; '.join(sorted(skipped))}")
    for reason in sorted(skipped):
        print(f"skipped: {reason}", file=sys.stderr)
    report.publish(rows, COLUMNS, f"commpress sim, {args.topology}", args, plot)
    return 0


def _check_pieces(op: str, algorithm: str, nodes: int, size: int) -> None:
    """ValueError where a row's pipelined reduction would hold more than
    :data:`MAX_PIECE_TRANSFERS` transfers (an absurd ``--size`` would exhaust the memory)."""
    numel = input_numel(op, size, nodes, torch.float32)
    transfers = piece_transfers(op, algorithm, nodes, numel)
    if transfers > MAX_PIECE_TRANSFERS:
        raise ValueError(
            f"--size {size_label(size)}: {algorithm}'s {op} on {nodes} nodes would be planned as "
            f"{transfers} transfers (n - 1 per piece of 2 MiB of a chunk), at most "
            f"{MAX_PIECE_TRANSFERS}: give a smaller --size or fewer --nodes"
        )


def _check_all_to_all_nodes(args) -> None:
    """ValueError where an all-to-all exchange would be modelled on more than
    :data:`MAX_ALL_TO_ALL_NODES`: the model follows its n x (n - 1) flows one by one."""
    nodes = max(args.nodes)
    if nodes <= MAX_ALL_TO_ALL_NODES:
        return
    for op, algorithm in itertools.product(args.op, args.algorithm):
        if algorithm != NATIVE and get_algorithm_or_none(algorithm, op):
            (schedule,) = plan(op, algorithm, 0, 2, 2, torch.float32, "none")
            if schedule.transport is Transport.ALL_TO_ALL:
                raise ValueError(
                    f"--nodes {nodes}: {algorithm}'s {op} sends from every node to every other "
                    f"in one step, {nodes} x {nodes - 1} flows that the model follows one by "
                    f"one: at most {MAX_ALL_TO_ALL_NODES} nodes"
                )


def _check_racks_hold_as_many(topology: Topology, text: str) -> None:
    """As an emulated cluster's (``commpress cluster up``), every rack holds as many hosts."""
    if isinstance(topology, Racks):
        try:
            check_racks(topology.count, topology.nodes)
        except ValueError as error:
            raise ValueError(f"--topology {text} --nodes {topology.nodes}: {error}") from None


def _params(args) -> Params:
    fields = {}
    if args.fit and args.calibrate:
        raise ValueError("--fit and --calibrate exclude each other: fit anew or reuse a fit")
    if args.fit:
        fields.update(calibrate.load(args.fit))
    if args.calibrate:
        repeated = same_twice(args.calibrate, os.path.realpath)
        if repeated:  # its rows would count twice towards the rows a fit needs
            raise ValueError(f"--calibrate: {repeated} are the same file")
        fields.update(calibrate.fit(args.calibrate, args.codec_speeds, not args.no_call_time))
        if not fields["message_s"]:  # an empty fit would be saved, then refused at every use
            raise ValueError(
                f"--calibrate: no op and algorithm has the {calibrate.MIN_ROWS} rows of two sizes "
                "or more a fit needs (see the warnings): sweep more sizes, e.g. -b 1M -e 16M"
            )
        if args.save_fit:
            calibrate.save(args.save_fit, fields)
            print(f"fit saved to {args.save_fit}: {calibrate.describe(fields)}")
    elif args.save_fit:
        raise ValueError("--save-fit saves what --calibrate fits: give --calibrate too")
    elif args.no_call_time:
        raise ValueError("--no-call-time is for --calibrate: give --calibrate too")
    if args.codec_speeds:
        fields["codec_bytes_per_s"] = calibrate.codec_speeds(args.codec_speeds)
    explicit = {
        "latency_s": None if args.latency_us is None else args.latency_us * 1e-6,
        "message_s": None if args.message_us is None else args.message_us * 1e-6,
        "call_s": None if args.call_us is None else args.call_us * 1e-6,
        "efficiency": args.efficiency,
        "uplink_efficiency": args.uplink_efficiency,
        "exchange_efficiency": args.exchange_efficiency,
        "concurrent_roots": args.roots,
        "shared_cores": args.shared_cores,
    }
    fields.update({key: value for key, value in explicit.items() if value is not None})
    if args.efficiency is not None:  # every level not given its own, as --help says
        for level in OPTIONAL_EFFICIENCIES:
            if getattr(args, level) is None:
                fields[level] = None
    return Params(**fields)


def plot(rows: list[dict], path: str) -> None:
    plt = report.pyplot()
    figure, axis = plt.subplots(figsize=(8, 5))
    for label, points in series(rows).items():
        nodes, times = zip(*points, strict=True)
        axis.plot(nodes, times, "o-", label=label)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("nodes")
    axis.set_ylabel("time per call (ms)")
    axis.legend(fontsize=7)
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(Path(path))


def series(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The plot's lines: ``(nodes, ms)`` by node count for each op, algorithm, codec, size
    asked and link (the size that moves rounds down differently for each node count)."""
    key = lambda r: (r["op"], r["algorithm"], r["codec"], r["asked_bytes"], r["link"])  # noqa: E731
    lines = {}
    for (op, algorithm, codec, size, link), group in itertools.groupby(sorted(rows, key=key), key):
        label = f"{op} {algorithm} {codec} {size_label(size)} {link}"
        group = sorted(group, key=lambda r: r["nodes"])
        lines[label] = [(r["nodes"], r["time_us"] / 1e3) for r in group]
    return lines


def size_label(size: int) -> str:
    """``size`` bytes in the largest binary unit that holds it whole: 64 KiB, 1 MiB, 1000 B."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def _microseconds(text: str) -> float:
    """A time of at least 0 and at most :data:`MAX_MICROSECONDS` (named as the option
    gives it)."""
    value = _number(text)
    if not 0 <= value <= MAX_MICROSECONDS:  # NaN too
        raise argparse.ArgumentTypeError(
            f"{text!r}: must be finite and at least 0, and at most {MAX_MICROSECONDS:g} "
            f"({MAX_MICROSECONDS * 1e-6:g} s)"
        )
    return value


def _fraction(text: str) -> float:
    """An efficiency: at least :data:`MIN_EFFICIENCY`, at most 1."""
    value = _number(text)
    if not 0 < value <= 1:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0 and at most 1")
    if value < MIN_EFFICIENCY:
        raise argparse.ArgumentTypeError(
            f"{text!r}: must be at least {MIN_EFFICIENCY:g} (a millionth of the link's rate; "
            f"model a slower link with --link)"
        )
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _int_list(text: str) -> list[int]:
    try:
        items = comma_list(text)
        values = [int(item) for item in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: node counts are integers") from None
    if any(value < 2 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every node count must be at least 2")
    if max(values) > MAX_NODES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: at most {MAX_NODES} nodes (a ring's n - 1 steps are planned for every row)"
        )
    _refuse_same_twice(text, items, int)
    return values


def _size_list(text: str) -> list[int]:
    """Comma-separated :func:`byte_size` values, whose reasons argparse shows."""
    items = comma_list(text)
    values = [byte_size(item) for item in items]
    _refuse_same_twice(text, items, byte_size)
    return values


def _refuse_same_twice(text: str, items: list[str], meaning) -> None:
    repeated = same_twice(items, meaning)
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r}: {repeated} are the same")


def get_algorithm_or_none(name: str, op: str):
    try:
        return get_algorithm(name, op)
    except ValueError:
        if name not in every_algorithm():
            known = ", ".join(every_algorithm())
            raise ValueError(f"--algorithm {name!r}: choose from {known}") from None
        return None
