"""``commpress schedule``: print what an algorithm does, step by step, without running it.

Prints ``str(Schedule)`` for the chosen rank (default: every rank), then the bytes the
busiest rank sends per call next to native's. Nothing is run and no process group is
made: the schedules are pure data.
"""

from __future__ import annotations

import argparse

from commpress.bench.arguments import (
    InvalidValue,
    naming,
    non_negative_int,
    positive_int,
    whole_number,
)
from commpress.codecs import get_codec
from commpress.collectives.checks import check_same_result_on_every_rank
from commpress.collectives.executor import POINT_TO_POINT_FROM_BYTES, point_to_point_on_gloo
from commpress.schedules.payloads import DEFAULT_CHUNK_BYTES, MIN_CHUNK_BYTES, chunk_numel
from commpress.schedules.registry import (
    NATIVE,
    OPS,
    algorithms,
    piece_transfers,
    plan,
    result_gather,
)
from commpress.schedules.wire import wire_bytes
from commpress.units import DTYPES, counted, torch_dtype

#: The most ranks a schedule is printed for: one rank's steps grow with them.
MAX_WORLD = 1 << 16
#: The most ranks whose schedules are all printed (no ``--rank``): some world x world steps.
MAX_WORLD_EVERY_RANK = 256
#: The most steps of a pipelined reduction printed in all (ranks x rounds x pieces per
#: chunk), each made, at about 1 KB, before the first is printed: as many as one rank's
#: ring in whole chunks on :data:`MAX_WORLD` ranks.
MAX_PIECE_STEPS = MAX_WORLD


def add_arguments(parser) -> None:
    parser.add_argument("--op", choices=OPS, required=True, help="the collective to schedule")
    parser.add_argument(
        "--algorithm",
        required=True,
        help="ring, ring-hop, backend; multicast (all-gather); alltoall (reductions)",
    )
    parser.add_argument(
        "--world",
        type=world_size,
        required=True,
        help=f"world size, at most {MAX_WORLD}; {MAX_WORLD_EVERY_RANK} without --rank",
    )
    parser.add_argument("--rank", type=int, help="print this rank's schedules only (every rank)")
    parser.add_argument(
        "--numel",
        type=non_negative_int,
        default=1 << 20,
        help="the rank's input: an all-gather's shard, a reduction's whole tensor (1048576)",
    )
    parser.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default="float",
        help="element type the bytes are counted for (float)",
    )
    parser.add_argument("--codec", default="none", help="codec spec, e.g. int8:block=128 (none)")
    parser.add_argument(
        "--chunk-bytes",
        type=chunk_bytes,
        default=DEFAULT_CHUNK_BYTES,
        help=f"piece size of the ring reduce-scatter's pipeline ({DEFAULT_CHUNK_BYTES})",
    )


def world_size(text: str) -> int:
    """``--world``: 1 to :data:`MAX_WORLD`."""
    value = positive_int(text)
    if value > MAX_WORLD:
        raise InvalidValue(f"{text!r}: at most {MAX_WORLD} ranks")
    return value


def chunk_bytes(text: str) -> int:
    """``--chunk-bytes``: at least 4, as the collectives take it."""
    value = whole_number(text)
    if value < MIN_CHUNK_BYTES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a collective's chunk_bytes is at least {MIN_CHUNK_BYTES}"
        )
    return value


def run(args) -> int:
    """Bad values raise ValueError: the command line prints it as a one-line error (exit 2)."""
    naming("--codec", get_codec, args.codec)
    known = tuple(name for name in algorithms(args.op) if name != NATIVE)
    if args.algorithm not in known:
        why = (
            "is torch.distributed's own collective: it has no schedule"
            if args.algorithm == NATIVE
            else f"is not an algorithm of {args.op}"
        )
        raise ValueError(f"--algorithm {args.algorithm!r} {why}; choose from {', '.join(known)}")
    if args.op == "reduce_scatter" and args.numel % args.world:
        raise ValueError(  # as reduce_scatter_tensor refuses it
            f"--numel {args.numel} does not split into {args.world} equal chunks: a "
            "reduce-scatter's input holds world x its output"
        )
    if args.rank is not None and not 0 <= args.rank < args.world:
        raise ValueError(f"--rank must be in [0, {args.world}), got {args.rank}")
    if args.rank is None and args.world > MAX_WORLD_EVERY_RANK:
        raise ValueError(
            f"--world {args.world} without --rank prints every rank's schedule, some "
            f"{args.world} x {args.world} steps: at most {MAX_WORLD_EVERY_RANK} ranks; give "
            "--rank for one rank's"
        )
    _check_pieces(args)
    gathers = result_gather(args.op, args.algorithm)
    if gathers is not None:  # as the collective refuses it
        check_same_result_on_every_rank(get_codec(args.codec), gathers)
    dtype = torch_dtype(args.dtype)
    ranks = range(args.world) if args.rank is None else (args.rank,)
    call = (args.world, args.numel, dtype, args.codec, args.chunk_bytes)
    schedules = [s for rank in ranks for s in plan(args.op, args.algorithm, rank, *call)]
    count = (args.codec, args.numel, args.world, dtype, args.chunk_bytes)
    sent = wire_bytes(args.op, args.algorithm, *count)
    native = wire_bytes(args.op, NATIVE, *count)
    print("\n\n".join(map(str, schedules)))
    print(f"\nbytes sent per call by the busiest rank: {sent} ({native} native)")
    by_name = {s.transport.value for s in schedules if point_to_point_on_gloo(s)}
    for transport in sorted(by_name):
        print(
            f"on gloo (CPU tensors) {transport} is posted as point-to-point sends and "
            "receives, every receive first: the first step's payloads reach "
            f"{POINT_TO_POINT_FROM_BYTES} bytes per peer"
        )
    return 0


def _check_pieces(args) -> None:
    """ValueError where a pipelined reduction (``ring``, ``alltoall``) cuts its chunks into
    more pieces than :data:`MAX_PIECE_STEPS` allows to print: ``--chunk-bytes 4`` on a
    large ``--numel``."""
    transfers = piece_transfers(args.op, args.algorithm, args.world, args.numel, args.chunk_bytes)
    ranks = args.world if args.rank is None else 1
    steps = ranks * transfers
    if steps > MAX_PIECE_STEPS:
        rounds = args.world - 1
        pieces, chunk = transfers // rounds, chunk_numel(args.numel, args.world)
        fewer = (
            "a larger --chunk-bytes or a smaller --numel"
            if args.rank is not None
            else "a larger --chunk-bytes, a smaller --numel or --rank"
        )
        raise ValueError(
            f"--chunk-bytes {args.chunk_bytes} cuts each chunk of {chunk} elements into "
            f"{pieces} pieces: {counted(ranks, 'rank')} x {counted(rounds, 'round')} x "
            f"{pieces} pieces, {steps} steps to print, at most {MAX_PIECE_STEPS}: give {fewer}"
        )
