"""``commpress train``: the same model, seed and data with and without compression.

Reports per configuration the median step time, tokens/s, the speedup over the
first configuration, the share of step time spent in collectives (time from a
collective's call to its completion, summed, over the step time; overlapped
collectives count too), the training and held-out losses and the megabytes (1e6
bytes) a rank sends per step, read from the collectives' schedules (``-`` for torch's own
PowerSGD hook, which no counter of ours sees; for torch's own collectives, what a
bandwidth-optimal ring sends, as ``commpress bench`` counts ``native``: gloo's
reduce-scatter sends twice that, so plain FSDP on gloo sends more); for low-rank hooks
also the time the training thread waited for the hook per step, and the share of
it the scheduler hides compared with the same spec ``@serial``. Writes a CSV of
the loss curves, a JSON summary and, with matplotlib, a PNG plot.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from pathlib import Path

from commpress.bench import report
from commpress.bench.arguments import (
    MAX_LOCAL_PROCESSES,
    bounded_int,
    local_processes,
    output_folder,
    output_path,
    positive_int,
    positive_number,
    seconds,
)
from commpress.cluster.commands import (
    add_link_arguments,
    check_multicast_on_cluster,
    cluster_from,
    multicast_options,
    tuner_network,
    wants_cluster,
)
from commpress.cluster.local import FSDP_MODULES, preload, run_distributed
from commpress.train.data import Corpus
from commpress.train.loop import (
    COSINE_FLOOR,
    OPTIMIZERS,
    SCHEDULES,
    SEED_LIMIT,
    Run,
    TrainConfig,
    train_worker,
)
from commpress.train.model import GPTConfig
from commpress.units import counted

COLUMNS = (
    ("run", "run", ""),
    ("step_ms", "step(ms)", ".1f"),
    ("tokens_per_s", "tokens/s", ".0f"),
    ("speedup", "speedup", ".2f"),
    ("comm_fraction", "comm share", ".2f"),
    ("final_loss", "train loss", ".4f"),
    ("eval_loss", "eval loss", ".4f"),
    ("eval_delta", "eval vs first", "+.2%"),
    ("wire_mb", "wire MB/rank/step", ".1f"),
)
LOWRANK_COLUMNS = (
    ("exposed_ms", "waited(ms)", ".1f"),
    ("hidden", "hidden", ".0%"),
)
#: Ranks of a run without the emulated cluster.
LOCAL_PROCESSES = 2
#: What ``--out`` gets: the loss curves, the summary and the plot.
CURVES, SUMMARY, PLOT = "losses.csv", "summary.json", "loss.png"


def config_from(args) -> TrainConfig:
    runs = tuple(Run.parse(text, args.strategy) for text in args.compare)
    if args.dim % args.heads:  # the model's own error names its fields, not the options
        raise ValueError(f"--dim {args.dim} must be a multiple of --heads {args.heads}")
    model = GPTConfig(context=args.context, dim=args.dim, layers=args.layers, heads=args.heads)
    return TrainConfig(
        runs=runs,
        model=model,
        strategy=args.strategy,
        steps=args.steps,
        batch_size=args.batch,
        optimizer=args.optimizer,
        learning_rate=args.lr,
        schedule=args.schedule,
        seed=args.seed,
        bf16=args.bf16,
    )


def main(args) -> int:
    _check_markdown_apart(args.markdown, args.out)
    config = config_from(args)
    _check_specs(config, wants_cluster(args))
    _check_context(config)
    tuned = any(run.tuned for run in config.runs)
    if config.strategy == "fsdp":
        preload(*FSDP_MODULES)  # once, not in every rank
    if not wants_cluster(args):
        nprocs = args.nprocs or LOCAL_PROCESSES
        if tuned:
            config = dataclasses.replace(config, tune=tuner_network())
        results = run_distributed(train_worker, nprocs, config, timeout=args.timeout)[0]
        where = counted(nprocs, "local gloo process", "local gloo processes")
    else:
        if args.nprocs is not None:
            raise ValueError("--nprocs is for local processes; on a cluster give --hosts")
        with cluster_from(args) as cluster:
            config = dataclasses.replace(config, multicast=multicast_options(cluster))
            if tuned:
                config = dataclasses.replace(config, tune=tuner_network(cluster))
            results = cluster.run(train_worker, config, timeout=args.timeout)[0]
            where = f"{counted(cluster.hosts, 'emulated host')}, links {cluster.link.describe()}"
            if cluster.racks > 1:
                where += f", {cluster.describe_racks()}"
    first = results[0]
    for row in results:
        row["step_ms"] = row["step_s"] * 1e3
        row["speedup"] = first["step_s"] / row["step_s"]
        row["eval_delta"] = row["eval_loss"] / first["eval_loss"] - 1
        row["wire_mb"] = row["wire_bytes"] / row["steps"] / 1e6
    columns = COLUMNS
    if any(run.lowrank is not None for run in config.runs):
        _add_hidden_share(results)
        columns = COLUMNS + LOWRANK_COLUMNS
    title = heading(config, where)
    # written before printing: a reader of standard output that has gone cannot cost them
    plotted = write_outputs(Path(args.out), title, results)
    if args.markdown:
        report.write_markdown(args.markdown, title, results, columns)
    print(f"# {title}")
    print(report.format_table(results, columns))
    if plotted:
        print(f"loss curves, summary and plot in {args.out}/")
    else:
        print(f"loss curves and summary in {args.out}/ (no plot: pip install 'commpress[plot]')")
    return 0


def _check_markdown_apart(markdown: str | None, out: str) -> None:
    """ValueError where ``--markdown`` names the ``--out`` folder or a file written there:
    one output would replace the other, or the table would fail to be written after the run."""
    if not markdown:
        return
    taken = [out] + [os.path.join(out, name) for name in (CURVES, SUMMARY, PLOT)]
    if os.path.realpath(markdown) in map(os.path.realpath, taken):
        raise ValueError(
            f"--markdown {markdown!r} is --out {out!r} or one of the files written there "
            f"({CURVES}, {SUMMARY}, {PLOT}): give the table a path of its own"
        )


def heading(config: TrainConfig, where: str) -> str:
    """What the table, the summary and the plot are of."""
    parameters = ", bf16 parameters" if config.bf16 else ""
    return (
        f"{config.strategy.upper()} GPT ({counted(config.model.layers, 'layer')}, "
        f"dim {config.model.dim}, "
        f"context {config.model.context}, batch {config.batch_size}/rank{parameters}), "
        f"{counted(config.steps, 'step')}, {config.optimizer} lr {config.lr:g} "
        f"{config.schedule}, {where}"
    )


def _add_hidden_share(results: list[dict]) -> None:
    """``hidden`` for a low-rank run with the scheduler whose ``@serial`` twin also ran:
    the share of the serial hook's time (all of it waited for) that the training thread
    no longer waits for."""
    waited_serial = {
        row["run"].removesuffix("@serial"): row["exposed_ms"]
        for row in results
        if row["run"].endswith("@serial")
    }
    for row in results:
        serial = waited_serial.get(row["run"])
        row["hidden"] = 1 - row["exposed_ms"] / serial if serial else float("nan")


def _check_specs(config: TrainConfig, on_cluster: bool) -> None:
    """Bad specs fail here, before any process starts; multicast needs the cluster; two
    runs that are one configuration written two ways are refused. Every message names the
    ``--compare`` value it is about."""
    label_of = {}
    for run in config.runs:
        try:
            _check_run(run, config.strategy, on_cluster, label_of)
        except ValueError as error:
            if str(error).startswith("--compare"):
                raise
            named = repr(run.label) in str(error)  # 'powersgd:rank=0', not 'none/int9'
            where = "--compare" if named else f"--compare {run.label!r}"
            raise ValueError(f"{where}: {error}") from None


def _check_run(run, strategy: str, on_cluster: bool, label_of: dict) -> None:
    from commpress.collectives import ALL_GATHER_ALGORITHMS, REDUCE_SCATTER_ALGORITHMS
    from commpress.integrations.fsdp import check_all_gather_codec
    from commpress.integrations.spec import CollectiveSpec
    from commpress.lowrank import get_algorithm

    if run.lowrank is not None:
        algorithm = get_algorithm(run.lowrank.removeprefix("torch-"))  # same options
        torch_hook = run.lowrank.startswith("torch-")
        options = tuple(sorted(vars(algorithm).items()))
        meaning = (torch_hook, algorithm.name, options, run.scheduler)
        _refuse_twice(label_of, meaning, run.label)
        return
    fsdp = strategy == "fsdp"  # cp.fsdp.compress takes auto specs
    gather = None
    if fsdp:
        gather = CollectiveSpec.parse(
            run.all_gather, ALL_GATHER_ALGORITHMS, "all-gather spec", gathers=True, tunable=True
        )
        check_all_gather_codec(gather, "all-gather spec")
        multicasts = gather.algorithm == "multicast"
        check_multicast_on_cluster(multicasts, on_cluster, f"spec {run.all_gather!r}")
    scatter = CollectiveSpec.parse(
        run.reduce_scatter,
        REDUCE_SCATTER_ALGORITHMS,
        "reduce spec",
        gathers=not fsdp,  # DDP all-reduces: its second half gathers
        tunable=fsdp,
    )
    _refuse_twice(label_of, (_meaning(gather), _meaning(scatter)), run.label)


def _refuse_twice(label_of: dict, meaning: tuple, label: str) -> None:
    """ValueError where an earlier run of ``label_of`` (labels by meaning) means the same."""
    first = label_of.setdefault(meaning, label)
    if first != label:
        raise ValueError(
            f"--compare {first!r} and {label!r} are the same configuration, "
            "which would only run twice"
        )


def _meaning(spec) -> tuple[str, str] | None:
    """What a parsed spec runs: torch's own collective ignores the codec."""
    if spec is None:
        return None
    if spec.algorithm == "native":
        return ("native", "none")
    return (spec.algorithm, str(spec.codec))


def _check_context(config: TrainConfig) -> None:
    """ValueError where a sequence is longer than the held-out text allows: the evaluation
    after the last step could not draw one, and the whole run was lost."""
    held_out = len(Corpus.standard_library(config.corpus_bytes).validation)
    longest = held_out - 1  # batch() needs context + 1 tokens
    if config.model.context > longest:
        raise ValueError(
            f"--context {config.model.context} is longer than the held-out text allows "
            f"({held_out} bytes): at most {longest}"
        )


def write_outputs(folder: Path, title: str, results: list[dict]) -> bool:
    """The loss curves, the summary and the plot written to ``folder``; whether the plot
    was (not without matplotlib: an earlier run's is removed, not left beside these)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / CURVES, "w", newline="") as table:
        writer = csv.writer(table)
        writer.writerow(["run", "step", "loss", "step_s"])
        for row in results:
            for step, (loss, seconds) in enumerate(
                zip(row["losses"], row["step_times"], strict=True)
            ):
                writer.writerow([row["run"], step, f"{loss:.6f}", f"{seconds:.6f}"])
    summary = [
        {k: _json_value(v) for k, v in row.items() if k not in ("losses", "step_times")}
        for row in results
    ]
    record = {"title": title, "provenance": report.provenance(), "runs": summary}
    (folder / SUMMARY).write_text(json.dumps(record, indent=2, allow_nan=False))
    if plot(folder / PLOT, title, results):
        return True
    (folder / PLOT).unlink(missing_ok=True)
    return False


def _json_value(value):
    """``value``, but null for a number that is not finite (JSON has no NaN: a strict
    reader refuses the file)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def plot(path: Path, title: str, results: list[dict]) -> bool:
    """The loss and step-time curves drawn to ``path``; False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (losses, times) = plt.subplots(1, 2, figsize=(11, 4.2))
    for row in results:
        losses.plot(row["losses"], label=row["run"])
        times.plot([s * 1e3 for s in row["step_times"]], label=row["run"])
    losses.set_xlabel("step")
    losses.set_ylabel("training loss (mean over ranks)")
    times.set_xlabel("step")
    times.set_ylabel("step time (ms)")
    for axes in (losses, times):
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return True


def seed(text: str) -> int:
    """``--seed``: within ``±SEED_LIMIT``, as :class:`TrainConfig` takes it."""
    return bounded_int(text, -SEED_LIMIT, SEED_LIMIT - 1)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--strategy",
        choices=("fsdp", "ddp"),
        default="fsdp",
        help="fsdp: FSDP2 (fully_shard), whose all-gathers and reduce-scatters the specs "
        "compress; ddp: DistributedDataParallel, whose gradient all-reduce a comm hook "
        "compresses, or a low-rank one (fsdp)",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        default=["plain", "int8", "int4"],
        metavar="RUN",
        help="configurations, same seed: plain (torch's collectives); a spec for every "
        "collective (int8, int8@ring-hop; with FSDP also auto, int8@auto: the tuner chooses, "
        "for the cluster's links); with FSDP also AG_SPEC/RS_SPEC (none/int4@alltoall: "
        "alltoall is a reduce-scatter's); with --strategy ddp also int4@alltoall, "
        "powersgd:rank=4 / acpsgd:rank=4 (@serial: no scheduler), torch-powersgd:rank=4 "
        "(plain int8 int4)",
    )
    parser.add_argument("--steps", type=positive_int, default=200, help="optimizer steps (200)")
    parser.add_argument("--batch", type=positive_int, default=8, help="sequences per rank (8)")
    parser.add_argument("--context", type=positive_int, default=64, help="tokens per sequence (64)")
    parser.add_argument("--dim", type=positive_int, default=128, help="model width (128)")
    parser.add_argument("--layers", type=positive_int, default=4, help="transformer blocks (4)")
    parser.add_argument("--heads", type=positive_int, default=4, help="attention heads (4)")
    parser.add_argument(
        "--optimizer",
        choices=sorted(OPTIMIZERS),
        default="adamw",
        help="adamw, or sgd with Nesterov momentum 0.9 (adamw)",
    )
    parser.add_argument(
        "--lr",
        type=positive_number,
        help="learning rate (" + ", ".join(f"{k} {v:g}" for k, v in OPTIMIZERS.items()) + ")",
    )
    parser.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="constant",
        help=f"learning rate: constant, or cosine decay to {COSINE_FLOOR:g} of it (constant)",
    )
    parser.add_argument(
        "--seed", type=seed, default=0, help="seed of every configuration, within ±2**43 (0)"
    )
    parser.add_argument("--bf16", action="store_true", help="FSDP: bf16 parameters, fp32 reduction")
    parser.add_argument(
        "--nprocs",
        type=local_processes,
        help=f"local processes, at most {MAX_LOCAL_PROCESSES} ({LOCAL_PROCESSES})",
    )
    add_link_arguments(parser, required=False)
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=3600.0,
        help="seconds for the job; past them every rank is stopped, exit status 124 (3600)",
    )
    parser.add_argument(
        "--out",
        type=output_folder,
        default="train-results",
        help="folder for CSV, JSON, PNG (train-results)",
    )
    parser.add_argument(
        "--markdown", type=output_path, metavar="PATH", help="also write the table as markdown"
    )
