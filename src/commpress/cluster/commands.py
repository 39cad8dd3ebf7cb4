"""``commpress cluster up|down|status`` and ``commpress launch``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator

from commpress.bench.arguments import (
    MAX_LOCAL_PROCESSES,
    bounded_int,
    port,
    positive_int,
    seconds,
)
from commpress.cluster.emulated import Emulated, cluster_for, not_up, present, remove
from commpress.cluster.launcher import DEFAULT_PORT
from commpress.cluster.layout import DEFAULT_PREFIX, MAX_HOSTS, Layout
from commpress.cluster.link import (
    DEFAULT_MTU,
    MAX_DELAY_US,
    MAX_MTU,
    MAX_RATE_BITS,
    MIN_MTU,
    MIN_RATE_BITS,
    format_rate,
    parse_delay,
    parse_rate,
)
from commpress.units import RATE_UNITS, check_racks


def add_link_arguments(parser, *, required: bool) -> None:
    """Options that describe (or find) a cluster; shared by every command that uses one."""
    parser.add_argument(
        "--hosts", type=host_count, required=required, help=f"number of hosts, 1 to {MAX_HOSTS}"
    )
    parser.add_argument(
        "--link", type=rate, required=required, help=f"rate of every host link, {RATES}"
    )
    parser.add_argument(
        "--racks",
        type=positive_int,
        help="racks the hosts are split into, numbered rack by rack, each joined to a spine "
        "by an uplink (1: one switch, no uplink); must divide --hosts",
    )
    parser.add_argument(
        "--uplink", type=rate, help=f"rate of every rack's uplink, {RATES} (the --link rate)"
    )
    parser.add_argument(
        "--delay",
        type=delay,
        help="added to every packet a host sends: a whole number of microseconds, in us, ms "
        f"or s: 1ms, 200us; at most {MAX_DELAY_US}us (none)",
    )
    parser.add_argument(
        "--mtu",
        type=mtu,
        help=f"MTU of every link, {MIN_MTU} to {MAX_MTU} ({DEFAULT_MTU})",
    )
    add_prefix_argument(parser, default=None)


def host_count(text: str) -> int:
    return bounded_int(text, 1, MAX_HOSTS)


def ranks_per_host(text: str) -> int:
    """``--nproc-per-host``: every host's ranks run on this machine, as local processes do."""
    return bounded_int(text, 1, MAX_LOCAL_PROCESSES)


def mtu(text: str) -> int:
    return bounded_int(text, MIN_MTU, MAX_MTU)


def rate(text: str) -> str:
    """``--link``, ``--uplink``: a rate the cluster's links take, kept as given."""
    return _checked(parse_rate, text)


def delay(text: str) -> str:
    """``--delay``: a delay netem takes, kept as given."""
    return _checked(parse_delay, text)


def _checked(parse, text: str) -> str:
    try:
        parse(text)
    except ValueError as error:  # argparse shows an ArgumentTypeError's reason
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


RATES = (
    f"each way, in {', '.join(RATE_UNITS)} (SI, as tc's): 1gbit, 100mbit; "
    f"{format_rate(MIN_RATE_BITS)} to {format_rate(MAX_RATE_BITS)}"
)


#: The options of :func:`add_link_arguments`: giving any of them asks for the cluster.
CLUSTER_OPTIONS = ("hosts", "link", "racks", "uplink", "delay", "mtu", "prefix")


def wants_cluster(args) -> bool:
    """Whether a command that can also run locally was asked for the emulated cluster: any
    option of :data:`CLUSTER_OPTIONS` given."""
    return any(getattr(args, name) is not None for name in CLUSTER_OPTIONS)


def check_multicast_on_cluster(multicasts: bool, on_cluster: bool, what: str) -> None:
    """Multicast runs between the hosts of the emulated cluster only (local processes
    share no network interface it can send on)."""
    if multicasts and not on_cluster:
        raise ValueError(
            f"{what}: multicast sends IP multicast between the hosts of the emulated "
            "cluster: give --hosts and --link (or --prefix of a cluster that is up)"
        )


@contextlib.contextmanager
def cluster_from(args) -> Iterator[Emulated]:
    """:func:`~commpress.cluster.emulated.cluster_for` with the options of
    :func:`add_link_arguments`: the cluster that is up, or one built for the command."""
    with cluster_for(
        args.hosts,
        args.link,
        racks=None if args.racks is None else racks_option(args),
        uplink=args.uplink,
        delay=args.delay,
        mtu=args.mtu,
        prefix=DEFAULT_PREFIX if args.prefix is None else args.prefix,
    ) as cluster:
        yield cluster


def add_prefix_argument(parser, default: str | None = DEFAULT_PREFIX) -> None:
    parser.add_argument(
        "--prefix",
        type=cluster_prefix,
        default=default,
        help="names of the cluster's namespaces and links: 1-6 lowercase letters or digits, "
        f"the first a letter ({DEFAULT_PREFIX})",
    )


def cluster_prefix(text: str) -> str:
    """``--prefix``: a name :class:`Layout` takes; an empty one (an unset shell variable)
    is refused, not taken for the default cluster, which may be another's."""
    try:
        Layout(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def add_cluster_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="build the cluster; it stays until `cluster down`")
    add_link_arguments(up, required=True)
    up.set_defaults(handler=cluster_up)
    down = actions.add_parser("down", help="remove the cluster and every process inside it")
    add_prefix_argument(down)
    down.set_defaults(handler=cluster_down)
    status = actions.add_parser(
        "status",
        help="hosts, addresses, links and traffic counters; exit status 1 where none is up",
    )
    add_prefix_argument(status)
    status.set_defaults(handler=cluster_status)


def racks_option(args) -> int:
    """``--racks`` (1 where not given), which must divide ``--hosts``
    (:func:`~commpress.units.check_racks`), its message naming both options where the
    check's names its arguments."""
    racks = 1 if args.racks is None else args.racks
    try:
        return check_racks(racks, args.hosts)
    except ValueError:
        raise ValueError(
            f"--racks {racks} must divide --hosts {args.hosts} (every rack holds as many hosts)"
        ) from None


def cluster_up(args) -> int:
    cluster = Emulated(
        args.hosts,
        args.link,
        racks=racks_option(args),
        uplink=args.uplink,
        delay=args.delay,
        mtu=DEFAULT_MTU if args.mtu is None else args.mtu,
        prefix=DEFAULT_PREFIX if args.prefix is None else args.prefix,
    )
    cluster.up()
    print(f"cluster up: {cluster.describe()}")
    return 0


def cluster_down(args) -> int:
    removed = remove(Layout(args.prefix))
    print(f"removed: {', '.join(removed)}" if removed else "nothing to remove")
    return 0


def cluster_status(args) -> int:
    if not present(Layout(args.prefix)):
        print(f"commpress cluster status: {not_up(args.prefix)}", file=sys.stderr)
        return 1
    cluster = Emulated.attach(args.prefix)
    print(f"cluster: {cluster.describe()}")
    print(f"{'host':>4}  {'namespace':<12} {'address':<15} {'tx bytes':>14} {'rx bytes':>14}")
    for host, counters in enumerate(cluster.counters()):
        print(
            f"{host:>4}  {cluster.namespaces[host]:<12} {cluster.addresses[host]:<15} "
            f"{counters.tx_bytes:>14} {counters.rx_bytes:>14}"
        )
    uplinks = cluster.uplink_counters()
    if uplinks:
        print(f"{'rack':>4}  {'uplink':<12} {'hosts':<15} {'up bytes':>14} {'down bytes':>14}")
    for rack, counters in enumerate(uplinks):
        members = [host for host in range(cluster.hosts) if cluster.rack_of(host) == rack]
        print(
            f"{rack:>4}  {cluster.layout.uplink_port(rack):<12} "
            f"{f'{members[0]}-{members[-1]}':<15} "
            f"{counters.tx_bytes:>14} {counters.rx_bytes:>14}"
        )
    return 0


def add_launch_arguments(parser) -> None:
    parser.description = (
        "Run the program given after -- on every host of the emulated cluster named --prefix "
        "that is up (`commpress cluster up`), or, given --hosts and --link, of one built for "
        "the job and removed after it; --nproc-per-host ranks each, with torchrun's variables. "
        "Exit status: the job's worst (127, 126: the program cannot be found, run; 1: no "
        "cluster is up)."
    )
    add_link_arguments(parser, required=False)
    parser.add_argument(
        "--nproc-per-host",
        type=ranks_per_host,
        default=1,
        help=f"ranks per host, at most {MAX_LOCAL_PROCESSES} (1)",
    )
    parser.add_argument(
        "--port",
        type=port,
        default=DEFAULT_PORT,
        help=f"rendezvous port, the ranks' MASTER_PORT ({DEFAULT_PORT})",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        help="stop every rank after this many seconds, exit status 124 (none)",
    )
    parser.add_argument(
        "program", nargs=argparse.REMAINDER, help="-- the program to run and its arguments"
    )
    parser.set_defaults(handler=launch)


def launch(args) -> int:
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        raise ValueError("give the command to run after --, e.g. -- python train.py")
    if args.hosts is not None:  # before a cluster is built for the job
        _check_ranks_in_all(args.hosts, args.nproc_per_host)
    with cluster_from(args) as cluster:
        _check_ranks_in_all(cluster.hosts, args.nproc_per_host)
        print(f"commpress launch: {cluster.describe()}", file=sys.stderr, flush=True)
        return cluster.launch(
            command, nproc_per_host=args.nproc_per_host, port=args.port, timeout=args.timeout
        )


def _check_ranks_in_all(hosts: int, nproc_per_host: int) -> None:
    """Every host's ranks run on this machine: at most as many as local processes."""
    if hosts * nproc_per_host > MAX_LOCAL_PROCESSES:
        raise ValueError(
            f"--nproc-per-host {nproc_per_host} on {hosts} hosts is {hosts * nproc_per_host} "
            f"ranks, all on this machine: at most {MAX_LOCAL_PROCESSES} in all"
        )


def tuner_network(cluster=None, fit: str | None = None) -> dict:
    """What the tuner must know of ``cluster`` (:func:`commpress.sim.tuner.configure`'s
    fields): its links, every host sharing this machine's cores; without one, local
    processes sharing them (the link the model's default). ``fit``: the tuner's fit."""
    network = {"fit": fit, "shared_cores": os.cpu_count()}
    if cluster is None:
        return network
    topology = "switch"
    if cluster.racks > 1:
        uplink = format_rate(cluster.uplink.rate_bits) if cluster.uplink else None
        topology = f"racks:count={cluster.racks}" + (f",uplink={uplink}" if uplink else "")
    return {"topology": topology, "link": format_rate(cluster.link.rate_bits), **network}


def multicast_options(cluster) -> dict:
    """What the multicast transport must know of ``cluster`` to pace its roots: the
    :class:`~commpress.transport.reliable_broadcast.Options` fields of its links."""
    return {
        "rate_bits": cluster.link.rate_bits,
        "racks": cluster.racks,
        "uplink_bits": cluster.uplink.rate_bits if cluster.uplink else None,
    }
