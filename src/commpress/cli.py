"""The ``commpress`` command line."""

from __future__ import annotations

import argparse
import signal
import sys

from commpress.bench import codecs as codec_bench
from commpress.bench import collectives as collective_bench
from commpress.bench import schedule_command, sim_command
from commpress.cluster import commands as cluster_commands
from commpress.cluster.system import ClusterError
from commpress.train import command as train_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commpress", description="Cheaper communication for distributed PyTorch training."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    codecs = commands.add_parser(
        "codecs", help="benchmark every codec: ratio, error, encode/decode GB/s vs memcpy"
    )
    codec_bench.add_arguments(codecs)
    codecs.set_defaults(handler=codec_bench.main)
    bench = commands.add_parser(
        "bench", help="nccl-tests-style sweep: compressed collectives vs torch.distributed"
    )
    collective_bench.add_arguments(bench)
    bench.set_defaults(handler=collective_bench.main)
    schedule = commands.add_parser(
        "schedule", help="print an algorithm's steps, rank by rank, without running it"
    )
    schedule_command.add_arguments(schedule)
    schedule.set_defaults(handler=schedule_command.run)
    sim = commands.add_parser(
        "sim", help="cost model on the schedules: time and traffic at up to thousands of nodes"
    )
    sim_command.add_arguments(sim)
    sim.set_defaults(handler=sim_command.main)
    cluster = commands.add_parser(
        "cluster", help="emulated cluster: hosts in network namespaces behind rate-limited links"
    )
    cluster_commands.add_cluster_arguments(cluster)
    launch = commands.add_parser(
        "launch", help="run a command as a multi-node job on the emulated cluster"
    )
    cluster_commands.add_launch_arguments(launch)
    train = commands.add_parser(
        "train", help="train a small GPT on the stdlib's source, with and without compression"
    )
    train_command.add_arguments(train)
    train.set_defaults(handler=train_command.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a killed command still cleans up
    # Ctrl-C even where the shell started us with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return args.handler(args)
    except (ValueError, TypeError, ImportError) as error:
        print(f"commpress {args.command}: error: {error}", file=sys.stderr)
        return 2
    except ClusterError as error:
        print(f"commpress {args.command}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"commpress {args.command}: interrupted", file=sys.stderr)
        return 130


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
