"""``commpress bench``: nccl-tests-style sweep of the compressed collectives vs torch's own.

Each size runs every (algorithm, codec) pair on the same inputs in one process
group; ``speedup`` is against ``native`` at the same size in the same invocation.
Times are the median over ``-n`` iterations of the slowest rank's time.

With ``--hosts N --link RATE`` the ranks run one per host of an emulated cluster
(built for the run, or the one already up), and every row also gets the bytes
each host really sent per call (``tx_bytes``, from its interface counters, all
headers included; ``tx_retransmitted``, the TCP segments it sent again), the time the
link needs for the bytes the algorithm must move through the busiest host link, in its
busier direction (``ideal_us`` = those bytes / RATE: a ring's wire bytes; a multicast
root's received bytes, n - 1 times what it sends) and
``efficiency`` = ideal / measured. ``--racks R --uplink RATE`` splits the hosts into racks
joined through a spine (rows get ``racks`` and ``uplink``); ``ideal_us`` stays that of the
host link.

Rows also get the CPU time per call, in microseconds, of the calling thread, of
commpress's communication thread, of the multicast protocol's thread, and of the whole
process (``cpu_*_us``, JSON only; mean over ranks).

``multicast`` paces each root for the cluster's links (host rate, racks, uplink), runs
``--roots`` broadcasts at once, and drops ``--loss`` of the datagrams each host receives
(seeded): rows get ``loss``, and ``repairs``, the datagrams sent again per timed call (all
ranks; like ``tx_bytes``, without the warm-up's).

Sizes are in bytes, as in nccl-tests: ``count`` = size / the ``--dtype``'s item size.
``wire(B)`` is read from the algorithm's schedules (:mod:`commpress.schedules.wire`).
``rel_err`` (rank 0's output) and
``#wrong`` (summed over ranks) compare with the exact result of the known inputs, and
``#wrong`` counts the elements outside the algorithm's error bound
(:mod:`commpress.bench.correctness`).

``--algorithm auto`` (and ``--codec auto:max_rel_err=E``) rows run what the tuner chose
(:mod:`commpress.sim.tuner`) and name it in ``chosen``; on an emulated cluster the tuner
plans for its links, every host sharing this machine's cores, with ``--tune-fit``'s fit.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

import commpress as cp
from commpress.bench import correctness, report
from commpress.bench.arguments import (
    MAX_LOCAL_PROCESSES,
    byte_size,
    comma_list,
    dtype_list,
    input_path,
    local_processes,
    naming,
    non_negative_int,
    output_path,
    plot_path,
    positive_int,
    probability,
    same_twice,
    seconds,
    size_factor,
    spec_list,
)
from commpress.cluster import Link, read_local, read_retransmitted
from commpress.cluster.commands import (
    add_link_arguments,
    check_multicast_on_cluster,
    cluster_from,
    multicast_options,
    tuner_network,
    wants_cluster,
)
from commpress.cluster.link import format_rate
from commpress.cluster.local import run_distributed
from commpress.collectives import auto, inband
from commpress.collectives.checks import check_same_result_on_every_rank
from commpress.schedules import (
    NATIVE,
    algorithms,
    busbw_factor,
    busiest_link_bytes,
    input_numel,
    moved_bytes,
)
from commpress.schedules.registry import result_gather
from commpress.sim import calibrate, tuner
from commpress.transport import multicast
from commpress.units import DTYPES, counted, torch_dtype

OPS = ("all_gather", "reduce_scatter", "all_reduce")
#: The ops whose ``--algorithm auto`` and ``--codec auto:...`` the tuner chooses.
TUNED_OPS = ("all_gather", "reduce_scatter")
COLUMNS = (
    ("size_bytes", "size(B)", "d"),
    ("count", "count", "d"),
    ("type", "type", ""),
    ("algorithm", "algorithm", ""),
    ("codec", "codec", ""),
    ("time_us", "time(us)", ".1f"),
    ("algbw_gbps", "algbw(GB/s)", ".3f"),
    ("busbw_gbps", "busbw(GB/s)", ".3f"),
    ("wire_bytes", "wire(B)", "d"),
    ("rel_err", "rel_err", ".2e"),
    ("wrong", "#wrong", "d"),
    ("speedup", "speedup", ".2f"),
)
#: CPU microseconds per call, mean over ranks (JSON only): see :func:`_cpu_seconds`.
CPU_FIELDS = ("cpu_caller_us", "cpu_comm_us", "cpu_progress_us", "cpu_process_us")
CLUSTER_COLUMNS = (
    ("tx_max", "tx/host(B)", "d"),
    ("ideal_us", "ideal(us)", ".1f"),
    ("efficiency", "efficiency", ".2f"),
)


def sizes(begin: int, end: int, factor: int) -> list[int]:
    result, size = [], begin
    while size <= end:
        result.append(size)
        size *= factor
    return result


def variants(algorithms: list[str], codecs: list[str]) -> list[tuple[str, str]]:
    """``native`` once (it ignores the codec), every other algorithm with every codec."""
    pairs = [("native", "none")]
    pairs += [(a, c) for a in algorithms if a != "native" for c in codecs]
    return pairs


def output_for(op: str, inp: torch.Tensor, world_size: int) -> torch.Tensor:
    """The output ``op`` fills from ``inp`` (contents undefined); the bench allocates it once
    per size and reuses it for every algorithm, as nccl-tests does."""
    if op == "all_gather":
        return inp.new_empty(inp.numel() * world_size)
    if op == "reduce_scatter":
        return inp.new_empty(inp.numel() // world_size)
    return inp.new_empty(inp.numel())


def run_collective(op: str, algorithm: str, codec: str, inp: torch.Tensor, out: torch.Tensor):
    """``op`` of ``inp`` into ``out`` (an all-reduce reduces a copy of ``inp`` in ``out``)."""
    if op == "all_gather":
        cp.all_gather_into_tensor(out, inp, codec=codec, algorithm=algorithm)
    elif op == "reduce_scatter":
        cp.reduce_scatter_tensor(out, inp, codec=codec, algorithm=algorithm)
    else:
        out.copy_(inp)
        cp.all_reduce(out, codec=codec, algorithm=algorithm)


#: Threads whose CPU time the rows report: commpress's communication thread (it runs
#: every compressed collective, synchronous or not) and the multicast protocol's thread.
_COMM_THREAD, _PROGRESS_THREAD = "commpress_", "commpress-multicast"


def _cpu_seconds() -> torch.Tensor:
    """CPU seconds so far of: the calling thread, the communication thread, the multicast
    thread(s), the whole process (gloo's threads included)."""
    comm = progress = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith((_COMM_THREAD, _PROGRESS_THREAD)) and thread.ident:
            try:
                seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, ProcessLookupError):  # it ended meanwhile
                continue
            if thread.name.startswith(_COMM_THREAD):
                comm += seconds
            else:
                progress += seconds
    seconds = [time.thread_time(), comm, progress, time.process_time()]
    return torch.tensor(seconds, dtype=torch.float64)  # float32 would blur a call's share


def _time(op, algorithm, codec, inp, out, iterations, warmups, interface=None):
    """Median seconds per call; the CPU microseconds per call of the threads of
    :func:`_cpu_seconds` (mean over ranks and calls, each counted from the call's start to
    its return: not the barrier before it nor the reduction of its time after); with
    ``interface`` the bytes and packets each rank sent per call (two lists, one entry per
    rank); for ``multicast`` the datagrams this rank sent again per call (else None). All
    count the timed calls alone, not the warm-up."""
    for _ in range(warmups):
        run_collective(op, algorithm, codec, inp, out)
    repaired = _repairs() if algorithm == "multicast" else None  # a first read sets it up
    dist.barrier()
    before = read_local(interface) if interface else None
    retransmitted = read_retransmitted() if interface else None
    times = []
    cpu = torch.zeros(len(CPU_FIELDS), dtype=torch.float64)
    for _ in range(iterations):
        dist.barrier()
        cpu_before = _cpu_seconds()
        start = time.perf_counter()
        run_collective(op, algorithm, codec, inp, out)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        cpu += _cpu_seconds() - cpu_before
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    repairs = None if repaired is None else (_repairs() - repaired) / iterations
    cpu = cpu / iterations * 1e6 / dist.get_world_size()
    dist.all_reduce(cpu)
    cpu_us = dict(zip(CPU_FIELDS, cpu.tolist(), strict=True))
    if interface is None:
        return statistics.median(times), cpu_us, None, repairs
    dist.barrier()  # every peer has received what this rank sent: it has left the link
    sent = read_local(interface) - before
    again = (read_retransmitted() - retransmitted) / iterations
    # the loop's own barriers and reductions of times, alone, are taken off the counts
    bookkeeping = _bookkeeping(interface, iterations, cpu.numel())
    tx_bytes = max(0, sent.tx_bytes - bookkeeping.tx_bytes)
    tx_packets = max(0, sent.tx_packets - bookkeeping.tx_packets)
    per_rank = [None] * dist.get_world_size()
    mine = (tx_bytes // iterations, tx_packets / iterations, again)
    dist.all_gather_object(per_rank, mine)
    tx = tuple(map(list, zip(*per_rank, strict=True)))
    return statistics.median(times), cpu_us, tx, repairs


def _bookkeeping(interface, iterations: int, cpu_fields: int):
    """What :func:`_time`'s loop sends besides the collective (a barrier and a reduction
    of the time per call, one reduction of the CPU times, the closing barrier), counted
    by running them alone."""
    dist.barrier()
    before = read_local(interface)
    for _ in range(iterations):
        dist.barrier()
        dist.all_reduce(torch.zeros(1, dtype=torch.float64), op=dist.ReduceOp.MAX)
    dist.all_reduce(torch.zeros(cpu_fields, dtype=torch.float64))
    dist.barrier()
    return read_local(interface) - before


def check_sizes(op: str, smallest: int, dtypes: list[str], world_size: int) -> None:
    """The smallest size must give every rank at least one element of every dtype."""
    for name in dtypes:
        dtype = torch_dtype(name)
        if input_numel(op, smallest, world_size, dtype) < 1:
            least = dtype.itemsize * (1 if op == "all_reduce" else world_size)
            raise ValueError(
                f"-b {smallest}: {op} of {name} on {counted(world_size, 'rank')} needs at least "
                f"{least} bytes (one element per rank)"
            )


#: ``--roots`` not given: the multicast transport's own default.
DEFAULT_ROOTS = multicast.Options().concurrent_roots


def check_roots(roots: int | None, hosts: int) -> None:
    """``--roots`` K: every host roots one broadcast, so no more than the hosts can send at
    once (a larger K ran as K = hosts, under the name of the K asked for)."""
    if roots is not None and roots > hosts:
        raise ValueError(
            f"--roots {roots}: more than the hosts ({hosts}), each of which roots one broadcast "
            f"(at most {hosts}: every host at once)"
        )


def _repairs() -> int:
    """Datagrams the multicast transport of the default group has sent again so far."""
    return multicast.channel_for(None).engine.stats.repairs_sent


def _worker(rank, world_size, config):
    op, pairs = config["op"], variants(config["algorithms"], config["codecs"])
    if config.get("tune"):
        tuner.configure(**config["tune"])
    if "multicast" in config["algorithms"]:
        multicast.configure(None, multicast.Options(**config["multicast"]))
    rows = []
    for dtype_name, size_bytes in itertools.product(
        config["dtypes"], sizes(config["begin"], config["end"], config["factor"])
    ):
        dtype = torch_dtype(dtype_name)
        numel = input_numel(op, size_bytes, world_size, dtype)
        inputs = [correctness.bench_input(r, numel, dtype) for r in range(world_size)]
        inp = inputs[rank]
        out = output_for(op, inp, world_size)
        exact = correctness.expected(op, inputs, rank)
        native_time = None
        for algorithm, codec in pairs:
            if rank == 0:
                print(
                    f"[{op}] {size_bytes} B {dtype_name} {algorithm} {codec}",
                    file=sys.stderr,
                    flush=True,
                )
            with auto.recording() as ran:
                seconds, cpu_us, tx, resent = _time(
                    op,
                    algorithm,
                    codec,
                    inp,
                    out,
                    config["iters"],
                    config["warmup"],
                    config.get("interface"),
                )
            out.fill_(float("nan"))  # what the checked call leaves unwritten counts as wrong
            run_collective(op, algorithm, codec, inp, out)
            chosen = ran[-1] if ran else None  # what the tuner gave the last timed call
            requested = (algorithm, codec)
            algorithm, codec = chosen or requested
            repairs = torch.tensor([resent or 0.0], dtype=torch.float64)
            dist.all_reduce(repairs)
            native_time = seconds if requested[0] == "native" else native_time
            bound = correctness.error_bound(op, algorithm, codec, inputs, rank)
            wrong = torch.tensor([correctness.count_wrong(out, exact, bound)])
            dist.all_reduce(wrong)
            error = (out.double() - exact).norm() / exact.norm()
            moved = moved_bytes(op, numel, world_size, dtype)
            algbw = moved / seconds / 1e9
            wire = inband.call_wire_bytes(op, algorithm, codec, inp, None)
            rows.append(
                {
                    "op": op,
                    "algorithm": requested[0],
                    "codec": requested[1],
                    **({"chosen": f"{codec}@{algorithm}"} if chosen else {}),
                    "size_bytes": moved,  # what moved, not what was asked
                    "count": moved // dtype.itemsize,
                    "type": dtype_name,
                    "time_us": seconds * 1e6,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * busbw_factor(op, world_size),
                    "wire_bytes": wire,
                    "rel_err": error.item(),
                    "wrong": int(wrong.item()),
                    "speedup": native_time / seconds,
                    "nprocs": world_size,
                    **cpu_us,
                    **(
                        {"loss": config["multicast"]["loss"], "repairs": repairs.item()}
                        if algorithm == "multicast"
                        else {}
                    ),
                    **_link_columns(
                        config.get("link_bits"),
                        busiest_link_bytes(op, algorithm, codec, numel, world_size, dtype),
                        seconds,
                        tx,
                    ),
                }
            )
    return rows if rank == 0 else None


def _link_columns(link_bits, busiest, seconds, tx) -> dict:
    if link_bits is None:
        return {}
    tx_bytes, tx_packets, retransmitted = tx
    ideal = Link(link_bits).seconds_for(busiest)
    return {
        "tx_bytes": tx_bytes,
        "tx_packets": tx_packets,
        "tx_retransmitted": retransmitted,  # TCP segments sent again, per call
        "tx_max": max(tx_bytes),
        "ideal_us": ideal * 1e6,
        "efficiency": ideal / seconds,
    }


def plot(rows: list[dict], path: str) -> None:
    plt = report.pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    several_dtypes = len({r["type"] for r in rows}) > 1
    for variant in dict.fromkeys((r["algorithm"], r["codec"], r["type"]) for r in rows):
        series = [r for r in rows if (r["algorithm"], r["codec"], r["type"]) == variant]
        algorithm, codec, dtype = variant
        label = "native" if algorithm == "native" else f"{algorithm} {codec}"
        label += f" {dtype}" if several_dtypes else ""
        axes.plot(
            [r["size_bytes"] for r in series],
            [r["busbw_gbps"] for r in series],
            marker="o",
            label=label,
        )
    axes.set_xscale("log", base=2)
    axes.set_xlabel("size (B)")
    axes.set_ylabel("busbw (GB/s)")
    first = rows[0]
    axes.set_title(
        title(
            first["op"],
            first["nprocs"],
            first.get("link"),
            first.get("racks", 1),
            first.get("uplink"),
        )
    )
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def title(
    op: str, world_size: int, link: str | None, racks: int = 1, uplink: str | None = None
) -> str:
    if link is None:
        return f"{op}, {counted(world_size, 'local gloo process', 'local gloo processes')}"
    text = f"{op}, {counted(world_size, 'emulated host')}, links {link}"
    if racks > 1:
        text += f", {racks} racks, {uplink} uplinks"
    return text


def check_algorithms(names: list[str], op: str, on_cluster: bool) -> None:
    """Every ``--algorithm`` runs ``op`` (or is ``auto``, where the tuner chooses for
    ``op``); multicast needs the cluster."""
    known = algorithms(op) + ((tuner.AUTO,) if op in TUNED_OPS else ())
    for name in names:
        if name not in known:
            raise ValueError(f"--algorithm {name!r}: {op} runs one of {', '.join(known)}")
    check_multicast_on_cluster("multicast" in names, on_cluster, "--algorithm multicast")


def _one_op(text: str) -> str:
    """``--op``: one op (``commpress sim --op`` takes a comma list, which here would have
    been called an invalid choice); argparse then checks it is one of :data:`OPS`."""
    if "," in text:
        raise argparse.ArgumentTypeError(
            f"{text!r}: one op a run (a run's rows, heading and speedups are of one "
            f"collective): run commpress bench once for each of them"
        )
    return text


def _codec_meaning(spec: str) -> str:
    return spec if tuner.is_auto(spec) else str(cp.get_codec(spec))


def check_variants(op: str, pairs: list[tuple[str, str]]) -> None:
    """Every (algorithm, codec) pair is one the collective runs: the tuner's ``auto`` codec
    only where it chooses for ``op``, a codec re-encoded at every hop only where its
    decoded values encode to themselves."""
    for algorithm, codec in pairs:
        if algorithm == NATIVE or algorithm == tuner.AUTO:
            continue
        if tuner.is_auto(codec):
            if op not in TUNED_OPS:
                raise ValueError(
                    f"--codec {codec!r}: the tuner chooses for {' and '.join(TUNED_OPS)} only"
                )
            continue
        gathers = result_gather(op, algorithm)
        if gathers is None:  # each rank keeps its own sum
            continue
        try:
            check_same_result_on_every_rank(cp.get_codec(codec), gathers)
        except ValueError as error:
            raise ValueError(f"--algorithm {algorithm} with --codec {codec}: {error}") from None


def main(args) -> int:
    if args.minbytes > args.maxbytes:
        raise ValueError(f"-b ({args.minbytes}) must not exceed -e ({args.maxbytes})")
    check_algorithms(args.algorithm, args.op, wants_cluster(args))
    multicasts = "multicast" in args.algorithm  # the bench's tuner never chooses multicast
    given = [f"--{name} {value}" for name, value, default in
             (("roots", args.roots, None), ("loss", args.loss, 0.0), ("seed", args.seed, 0))
             if value != default]  # fmt: skip
    if given and not multicasts:
        raise ValueError(f"{' and '.join(given)}: for --algorithm multicast, which is not run")
    if args.seed != 0 and args.loss == 0:
        raise ValueError(f"--seed {args.seed}: the seed of --loss, which drops nothing (0)")
    for codec in args.codec:  # fail on a bad spec or dtype before spawning anything
        if tuner.is_auto(codec):
            naming("--codec", tuner.budget, codec)
            continue
        built = naming("--codec", cp.get_codec, codec)
        for dtype in args.dtype:
            built.check_dtype(torch_dtype(dtype), "--dtype")
    repeated = same_twice(args.codec, _codec_meaning)
    if repeated:
        raise ValueError(f"--codec: {repeated} are the same codec, which would repeat rows")
    check_variants(args.op, variants(args.algorithm, args.codec))
    config = {
        "op": args.op,
        "algorithms": args.algorithm,
        "codecs": args.codec,
        "begin": args.minbytes,
        "end": args.maxbytes,
        "factor": args.stepfactor,
        "iters": args.iters,
        "warmup": args.warmup,
        "dtypes": args.dtype,
        "multicast": {
            "concurrent_roots": args.roots or DEFAULT_ROOTS,
            "loss": args.loss,
            "seed": args.seed,
        },
    }
    tuned = "auto" in args.algorithm or any(map(tuner.is_auto, args.codec))
    if args.tune_fit and not tuned:
        raise ValueError(
            f"--tune-fit {args.tune_fit}: for --algorithm auto or --codec auto:..., "
            "which is not run"
        )
    if args.tune_fit:
        calibrate.load(args.tune_fit)  # a bad file is named before any process starts
    columns, link, racks, uplink = COLUMNS, None, 1, None
    if not wants_cluster(args):
        if tuned:  # local processes share this machine; the link is the model's default
            config["tune"] = tuner_network(None, args.tune_fit)
        check_sizes(args.op, args.minbytes, args.dtype, args.nprocs or 4)
        rows = run_distributed(_worker, args.nprocs or 4, config, timeout=args.timeout)[0]
    else:
        if args.nprocs is not None:
            raise ValueError("--nprocs is for local processes; on a cluster give --hosts")
        if args.hosts is not None:  # before a cluster is built for nothing
            check_sizes(args.op, args.minbytes, args.dtype, args.hosts)
            check_roots(args.roots, args.hosts)
        with cluster_from(args) as cluster:
            check_sizes(args.op, args.minbytes, args.dtype, cluster.hosts)  # one that is up
            check_roots(args.roots, cluster.hosts)
            config.update(interface=cluster.layout.interface, link_bits=cluster.link.rate_bits)
            if tuned:
                config["tune"] = tuner_network(cluster, args.tune_fit)
            config["multicast"].update(multicast_options(cluster))
            rows = cluster.run(_worker, config, timeout=args.timeout)[0]
            link, racks = cluster.link.describe(), cluster.racks
            uplink = format_rate(cluster.uplink.rate_bits) if cluster.uplink else None
        columns = COLUMNS + CLUSTER_COLUMNS
        for row in rows:
            row.update(link=link, racks=racks, uplink=uplink)
    if any("chosen" in row for row in rows):
        columns += (("chosen", "chosen", ""),)
        for row in rows:
            row.setdefault("chosen", "")
    heading = f"{title(args.op, rows[0]['nprocs'], link, racks, uplink)}, median of {args.iters}"
    report.publish(rows, columns, f"{heading}: compressed vs native", args, plot, f"# {heading}")
    return 0


def add_arguments(parser) -> None:
    parser.add_argument("-b", "--minbytes", type=byte_size, default=1 << 20, help="first size (1M)")
    parser.add_argument(
        "-e", "--maxbytes", type=byte_size, default=64 << 20, help="last size (64M)"
    )
    parser.add_argument(
        "-f", "--stepfactor", type=size_factor, default=2, help="size multiplier (2)"
    )
    parser.add_argument(
        "--op",
        type=_one_op,
        choices=OPS,
        default="all_gather",
        help="the collective to time, one a run (all_gather)",
    )
    parser.add_argument(
        "--dtype",
        type=dtype_list,
        default=["float"],
        help=f"comma-separated element types of {{{','.join(DTYPES)}}}, named as nccl-tests "
        "names them (float)",
    )
    parser.add_argument(
        "--algorithm",
        type=comma_list,
        default=["native", "ring", "ring-hop"],
        help="comma-separated algorithms (native,ring,ring-hop)",
    )
    parser.add_argument(
        "--codec",
        type=spec_list,
        default=["int8", "int4"],
        help="comma-separated codec specs (int8,int4)",
    )
    parser.add_argument("-n", "--iters", type=positive_int, default=5, help="timed iterations (5)")
    parser.add_argument(
        "-w", "--warmup", type=non_negative_int, default=1, help="warm-up iterations (1)"
    )
    parser.add_argument(
        "--nprocs",
        type=local_processes,
        help=f"local gloo processes, at most {MAX_LOCAL_PROCESSES} (4)",
    )
    add_link_arguments(parser, required=False)
    parser.add_argument(
        "--roots",
        type=positive_int,
        help=f"multicast: broadcasts at once, at most the hosts ({DEFAULT_ROOTS})",
    )
    parser.add_argument(
        "--loss",
        type=probability,
        default=0.0,
        help="multicast: fraction of received datagrams dropped on purpose (0)",
    )
    parser.add_argument("--seed", type=int, default=0, help="multicast: seed of --loss (0)")
    parser.add_argument(
        "--tune-fit",
        type=input_path,
        metavar="FIT.json",
        help="--algorithm auto / --codec auto:...: the fit of `commpress sim --save-fit` the "
        "tuner plans with (default: the model's defaults); rows get the choice in `chosen`",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=1800.0,
        help="seconds for the sweep; past them every rank is stopped, exit status 124 (1800)",
    )
    parser.add_argument(
        "--json", type=output_path, metavar="PATH", help="also write the rows as JSON"
    )
    parser.add_argument(
        "--markdown", type=output_path, metavar="PATH", help="also write a markdown report"
    )
    parser.add_argument("--plot", type=plot_path, metavar="PATH", help="PNG of busbw vs size")
