"""``commpress codecs``: compression ratio, error and single-thread throughput of each codec.

Throughput counts input bytes (fp32) per second, encoding into and decoding from
preallocated buffers; the memcpy rate of the same buffer, measured in the same run,
is the yardstick. Times are medians over ``repeats``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from commpress.bench import report
from commpress.bench.arguments import (
    named_twice,
    naming,
    output_path,
    positive_int,
    same_twice,
    spec_list,
    whole_number,
)
from commpress.codecs import get_codec
from commpress.units import counted

DEFAULT_CODECS = ("none", "bf16", "fp16", "int8", "int4", "fp8", "zfp:rate=8", "zfp:rate=16")
STUDENT_T_DOF = 3.0
COLUMNS = (
    ("codec", "codec", ""),
    ("ratio", "ratio", ".2f"),
    ("rel_err_gaussian", "rel_err(gauss)", ".2e"),
    ("rel_err_student_t", "rel_err(t3)", ".2e"),
    ("encode_gbps", "encode(GB/s)", ".2f"),
    ("decode_gbps", "decode(GB/s)", ".2f"),
    ("encode_vs_memcpy", "enc/memcpy", ".2f"),
    ("decode_vs_memcpy", "dec/memcpy", ".2f"),
)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: compilation, allocator, caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def relative_l2_error(spec: str, x: torch.Tensor) -> float:
    codec = get_codec(spec)
    decoded = codec.decode(codec.encode(x), x.numel(), x.dtype)
    return ((decoded.double() - x.double()).norm() / x.double().norm()).item()


def run(specs: Sequence[str], numel: int, repeats: int, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    gaussian = torch.randn(numel, generator=generator)
    torch.manual_seed(seed)
    student_t = torch.distributions.StudentT(STUDENT_T_DOF).sample((numel,))
    input_bytes = gaussian.numel() * gaussian.element_size()
    scratch = torch.empty_like(gaussian)
    memcpy_gbps = input_bytes / median_seconds(lambda: scratch.copy_(gaussian), repeats) / 1e9
    # Reading the input once is the upper bound of any encoder of fp32 data.
    read_gbps = input_bytes / median_seconds(gaussian.sum, repeats) / 1e9
    print(f"memcpy: {memcpy_gbps:.2f} GB/s, read-only: {read_gbps:.2f} GB/s", file=sys.stderr)

    rows = []
    for index, spec in enumerate(specs, 1):
        print(f"[{index}/{len(specs)}] {spec} ...", file=sys.stderr, flush=True)
        codec = get_codec(spec)
        payload = codec.encode(gaussian)
        # Preallocated buffers in both directions, as a collective's send/receive buffers are.
        encode_s = median_seconds(lambda c=codec, p=payload: c.encode(gaussian, out=p), repeats)
        decode_s = median_seconds(
            lambda c=codec, p=payload: c.decode(p, numel, torch.float32, out=scratch), repeats
        )
        encode_gbps, decode_gbps = input_bytes / encode_s / 1e9, input_bytes / decode_s / 1e9
        rows.append(
            {
                "codec": spec,
                "numel": numel,
                "wire_bytes": payload.numel(),
                "ratio": input_bytes / payload.numel(),
                "rel_err_gaussian": relative_l2_error(spec, gaussian),
                "rel_err_student_t": relative_l2_error(spec, student_t),
                "encode_gbps": encode_gbps,
                "decode_gbps": decode_gbps,
                "memcpy_gbps": memcpy_gbps,
                "read_gbps": read_gbps,
                "encode_vs_memcpy": encode_gbps / memcpy_gbps,
                "decode_vs_memcpy": decode_gbps / memcpy_gbps,
                "threads": torch.get_num_threads(),
            }
        )
    return rows


def summary(args, row: dict) -> str:
    return (
        f"{counted(args.numel, 'fp32 value')} ({args.numel * 4 / 2**20:.3g} MiB), "
        f"{counted(args.threads, 'thread')}, "
        f"median of {args.repeats}; memcpy {row['memcpy_gbps']:.2f} GB/s, "
        f"read-only stream {row['read_gbps']:.2f} GB/s (the ceiling of any encoder)"
    )


def available_default_codecs() -> list[str]:
    """The default list, without zfp where zfpy is not installed (said on stderr)."""
    specs = []
    for spec in DEFAULT_CODECS:
        try:
            get_codec(spec)
        except ImportError as missing:
            print(f"skipping {spec}: {missing}", file=sys.stderr)
            continue
        specs.append(spec)
    return specs


#: A run's peak memory in multiples of its fp32 input: the two inputs, the scratch output,
#: the payloads and the float64 copies the errors are computed in (measured: about 17).
MEMORY_PER_INPUT = 18


def value_count(text: str) -> int:
    """``--numel``: at least 1, and few enough that a run fits in this machine's memory
    (past it torch failed with a traceback: 'can't allocate memory')."""
    value = positive_int(text)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if value * 4 * MEMORY_PER_INPUT > memory:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a run holds about {MEMORY_PER_INPUT} times its input of "
            f"{value * 4 / 2**30:.3g} GiB, more than this machine's {memory / 2**30:.3g} GiB: "
            f"at most {memory // (4 * MEMORY_PER_INPUT)}"
        )
    return value


def thread_count(text: str) -> int:
    """``--threads``: 1 to the machine's cores (torch crashed at exit with 100000; more
    threads than cores measure the scheduler, not the codec)."""
    value = positive_int(text)
    cores = os.cpu_count() or 1
    if value > cores:
        raise argparse.ArgumentTypeError(
            f"{text!r}: at most the machine's {counted(cores, 'core')}"
        )
    return value


#: The seeds torch's generators take: ``[-2**63, 2**64)``.
SEED_RANGE = (-(1 << 63), 1 << 64)


def torch_seed(text: str) -> int:
    """``--seed``: an integer torch's generators take (past their range torch said only
    'Overflow when unpacking long long')."""
    value = whole_number(text)
    if not SEED_RANGE[0] <= value < SEED_RANGE[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: torch takes seeds in [-2**63, 2**64)")
    return value


def main(args) -> int:
    specs = args.codec or available_default_codecs()
    for spec in specs:
        naming("--codec", get_codec, spec)  # fail on a bad spec before minutes of benchmarking
    repeated = named_twice(specs)
    if repeated:
        raise ValueError(f"--codec {', '.join(repeated)} given twice")
    repeated = same_twice(specs, lambda spec: str(get_codec(spec)))
    if repeated:
        raise ValueError(f"--codec {repeated} are the same codec")
    torch.set_num_threads(args.threads)
    rows = run(specs, args.numel, args.repeats, args.seed)
    if args.json:  # before printing: a reader of standard output that has gone cannot cost it
        report.write_json(args.json, rows)
    if args.markdown:
        report.write_markdown(
            args.markdown, "Codec throughput and error", rows, COLUMNS, notes=summary(args, rows[0])
        )
    print(summary(args, rows[0]))
    print(report.format_table(rows, COLUMNS))
    return 0


def add_arguments(parser) -> None:
    parser.add_argument(
        "--codec",
        type=spec_list,
        action="extend",
        metavar="SPEC",
        help="codec specs to measure, comma-separated as in `commpress bench` (int8,int4) or "
        "repeated; default: all built-in codecs",
    )
    parser.add_argument(
        "--numel",
        type=value_count,
        default=1 << 24,
        help=f"fp32 values per tensor; a run takes about {MEMORY_PER_INPUT} times their bytes "
        "of memory (default: 16777216, 64 MiB)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=7,
        help="timed repeats; the median is reported (default: 7)",
    )
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=1,
        help="torch intra-op threads, at most the cores (default: 1)",
    )
    parser.add_argument("--seed", type=torch_seed, default=0, help="seed of the test data (0)")
    parser.add_argument(
        "--json", type=output_path, metavar="PATH", help="also write the rows as JSON"
    )
    parser.add_argument(
        "--markdown", type=output_path, metavar="PATH", help="also write a markdown report"
    )
