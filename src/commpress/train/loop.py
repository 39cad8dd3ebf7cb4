"""The training job run on every rank: each configuration in turn, same seed, same data."""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

import commpress as cp
from commpress.bench.arguments import named_twice
from commpress.lowrank.registry import ALGORITHMS
from commpress.sim import tuner
from commpress.spec_options import split_algorithm, split_spec
from commpress.train.data import Corpus, batch
from commpress.train.model import GPT, GPTConfig
from commpress.transport import multicast

UNCOMPRESSED = "plain"
TORCH_POWERSGD = "torch-powersgd"
#: torch's PowerSGDState seeds ``numpy.random.RandomState``, which takes seeds below this.
TORCH_POWERSGD_SEEDS = 1 << 32
LOWRANK_NAMES = tuple(ALGORITHMS)
TORCH_COLLECTIVE = "none@native"  # torch's own collective, through commpress's timing adapter


@dataclass(frozen=True)
class Run:
    """One configuration: ``plain`` (torch's collectives), ``SPEC`` or ``AG_SPEC/RS_SPEC``;
    for DDP also a low-rank algorithm (``powersgd:rank=4``, ``@serial`` for no scheduler)
    or ``torch-powersgd:rank=4`` (torch's own hook; on gloo it may hang or abort)."""

    label: str
    all_gather: str
    reduce_scatter: str
    lowrank: str | None = None
    scheduler: bool = True

    @property
    def tuned(self) -> bool:
        """Whether the tuner chooses for either spec (``auto``, ``int8@auto``)."""
        return any(
            tuner.is_auto(codec) or algorithm == tuner.AUTO
            for codec, _, algorithm in (
                split_algorithm(s) for s in (self.all_gather, self.reduce_scatter)
            )
        )

    @classmethod
    def parse(cls, text: str, strategy: str) -> Run:
        if text == UNCOMPRESSED:
            return cls(text, TORCH_COLLECTIVE, TORCH_COLLECTIVE)
        spec, at, mode = split_algorithm(text)
        name = split_spec(spec)[0]  # powersgd@serial has no options
        if name in LOWRANK_NAMES or name == TORCH_POWERSGD:
            if strategy != "ddp":
                raise ValueError(f"--compare {text!r}: low-rank compression needs --strategy ddp")
            if at and not mode:
                raise ValueError(f"--compare {text!r}: nothing after '@' (@serial, or no '@')")
            if mode not in ("", "serial"):
                raise ValueError(f"--compare {text!r}: only @serial may follow a low-rank spec")
            if name == TORCH_POWERSGD:
                if mode:
                    raise ValueError(
                        f"--compare {text!r}: torch's PowerSGD hook has no scheduler of ours "
                        "to leave out: no @serial"
                    )
                torch_powersgd_state(spec)  # options torch's hook cannot honour are refused
            return cls(text, TORCH_COLLECTIVE, TORCH_COLLECTIVE, spec, mode != "serial")
        gather, slash, scatter = text.partition("/")
        if strategy == "ddp" and slash:
            raise ValueError(f"--compare {text!r}: DDP all-reduces; give one spec, not AG/RS")
        return cls(text, gather, scatter if slash else gather)


#: Optimizers ``commpress train`` offers, with their default learning rates.
OPTIMIZERS = {"adamw": 3e-3, "sgd": 0.1}
SGD_MOMENTUM = 0.9
#: Learning-rate schedules: constant, or cosine decay to this share of the start over the run.
SCHEDULES = ("constant", "cosine")
COSINE_FLOOR = 0.1
#: A rank draws its batches from ``seed * RANK_SEED_STRIDE + rank``, which torch takes
#: within 64 bits: seeds within ``±SEED_LIMIT`` keep it there for any number of ranks.
RANK_SEED_STRIDE = 1_000_003
SEED_LIMIT = 1 << 43


@dataclass(frozen=True)
class TrainConfig:
    runs: tuple[Run, ...]
    model: GPTConfig
    strategy: str = "fsdp"
    steps: int = 200
    batch_size: int = 8
    optimizer: str = "adamw"
    learning_rate: float | None = None
    schedule: str = "constant"
    seed: int = 0
    corpus_bytes: int = 4 << 20
    bf16: bool = False
    eval_batches: int = 4
    #: :class:`~commpress.transport.reliable_broadcast.Options` fields for ``@multicast``
    #: (the cluster's link rates), or None for the defaults and ``COMMPRESS_MULTICAST``.
    multicast: dict | None = None
    #: :func:`commpress.sim.tuner.configure` fields for ``auto`` specs (the cluster's
    #: links), or None for the ``COMMPRESS_TUNE_*`` environment.
    tune: dict | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            known = sorted(OPTIMIZERS)
            raise ValueError(f"optimizer must be one of {known}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.bf16 and self.strategy != "fsdp":
            raise ValueError(
                "--bf16 sets FSDP2's parameter dtype: it is for --strategy fsdp "
                f"(a {self.strategy} run trains in fp32)"
            )
        if not -SEED_LIMIT <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be within ±2**43, got {self.seed}")
        if self.learning_rate is not None and not 0 < self.learning_rate < math.inf:
            raise ValueError(f"learning rate must be positive and finite, got {self.learning_rate}")
        repeated = named_twice([run.label for run in self.runs])
        if repeated:
            raise ValueError(f"--compare names {', '.join(repeated)} twice")

    @property
    def lr(self) -> float:
        """The learning rate used: the one given, or the optimizer's default."""
        return OPTIMIZERS[self.optimizer] if self.learning_rate is None else self.learning_rate

    def make_optimizer(self, parameters) -> torch.optim.Optimizer:
        """AdamW (fused), or SGD with Nesterov momentum (PowerSGD's published setting)."""
        if self.optimizer == "sgd":
            return torch.optim.SGD(parameters, lr=self.lr, momentum=SGD_MOMENTUM, nesterov=True)
        return torch.optim.AdamW(parameters, lr=self.lr, fused=True)

    def lr_factor(self, step: int) -> float:
        """The learning rate at ``step`` as a share of :attr:`lr`."""
        if self.schedule == "constant":
            return 1.0
        cosine = 0.5 * (1 + math.cos(math.pi * step / self.steps))
        return COSINE_FLOOR + (1 - COSINE_FLOOR) * cosine


@dataclass
class Curves:
    """One run, step by step: loss (mean over ranks), step time, time in collectives, and
    time the training thread waited for a low-rank hook (NaN where not measured)."""

    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    comm_seconds: list[float] = field(default_factory=list)
    exposed_seconds: list[float] = field(default_factory=list)


def _wrap(model: GPT, config: TrainConfig, run: Run):
    """The parallel model, and the counters of its collectives."""
    if config.strategy == "ddp":
        ddp = DistributedDataParallel(model)
        if run.lowrank is None:
            state, hook = cp.ddp.hook(run.all_gather)
            ddp.register_comm_hook(state, hook)
            return ddp, [state.stats]
        if run.lowrank.startswith(TORCH_POWERSGD):
            return ddp, _torch_powersgd(ddp, run.lowrank)
        state, hook = cp.lowrank.ddp_hook(run.lowrank, model=model, scheduler=run.scheduler)
        ddp.register_comm_hook(state, hook)
        return ddp, [state.reducer.stats]
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if config.bf16 else None, reduce_dtype=torch.float32
    )
    mesh = cp.fsdp.cpu_mesh()  # the demo trains on the CPU, whatever accelerator is visible
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    compression = cp.fsdp.compress(model, run.all_gather, run.reduce_scatter)
    return model, [compression.all_gather, compression.reduce_scatter]


def torch_powersgd_state(spec: str) -> dict:
    """``torch-powersgd:OPTIONS`` as the arguments of torch's ``PowerSGDState``: every
    option of ``powersgd`` but an orthogonalization other than Gram-Schmidt (torch's only
    one), a seed of 2**32 or more (numpy's RandomState's limit), and a ``start_iter`` below
    2 with error feedback or warm start (torch requires it)."""
    algorithm = cp.lowrank.get_algorithm("powersgd" + spec.removeprefix(TORCH_POWERSGD))
    if algorithm.orthogonalization != "gram-schmidt":
        raise ValueError(
            f"--compare {spec!r}: torch's PowerSGD orthogonalizes by Gram-Schmidt only, "
            f"not {algorithm.orthogonalization!r}"
        )
    if algorithm.start_iter < 2 and (algorithm.error_feedback or algorithm.warm_start):
        raise ValueError(
            f"--compare {spec!r}: torch's PowerSGD needs start_iter of at least 2 with "
            "error feedback or warm start"
        )
    if algorithm.seed >= TORCH_POWERSGD_SEEDS:
        raise ValueError(
            f"--compare {spec!r}: torch's PowerSGD seeds numpy's RandomState, which takes a "
            f"seed below 2**32, not {algorithm.seed}"
        )
    return {
        "matrix_approximation_rank": algorithm.rank,
        "start_powerSGD_iter": algorithm.start_iter,
        "min_compression_rate": algorithm.min_compression_rate,
        "use_error_feedback": algorithm.error_feedback,
        "warm_start": algorithm.warm_start,
        "random_seed": algorithm.seed,
    }


def _torch_powersgd(ddp, spec: str) -> list:
    """torch's own PowerSGD hook, for comparison (on gloo it may hang or abort)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    state = powerSGD_hook.PowerSGDState(process_group=None, **torch_powersgd_state(spec))
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return []


def _loss(model, tokens, targets) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class Progress:
    """A progress bar on a terminal, a line every tenth of the run elsewhere."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.interactive = enabled and sys.stderr.isatty()

    def update(self, step: int, loss: float, seconds: float) -> None:
        if not self.enabled:
            return
        done = step + 1
        if not self.interactive and done % max(1, self.total // 10) and done != self.total:
            return
        width = 30
        filled = width * done // self.total
        bar = "#" * filled + "." * (width - filled)
        line = f"[{self.label:>12}] {bar} {done}/{self.total} loss {loss:.3f} {seconds:.2f} s/step"
        end = "\r" if self.interactive and done != self.total else "\n"
        print(line, end=end, file=sys.stderr, flush=True)


def configure(config: TrainConfig) -> None:
    """This rank's multicast transport and tuner, for the network the runs are on."""
    if config.multicast is not None:
        multicast.set_default_options(multicast.Options(**config.multicast))
    if config.tune is not None:
        tuner.configure(**config.tune)


def train_worker(rank: int, world_size: int, config: TrainConfig):
    torch.set_num_threads(1)
    configure(config)
    corpus = Corpus.standard_library(config.corpus_bytes)
    side = dist.new_group()  # loss averaging, never mixed with the measured traffic
    results = []
    for run in config.runs:
        torch.manual_seed(config.seed)
        model, counters = _wrap(GPT(config.model), config, run)
        optimizer = config.make_optimizer(model.parameters())
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, config.lr_factor)
        generator = torch.Generator().manual_seed(config.seed * RANK_SEED_STRIDE + rank)
        progress = Progress(run.label, config.steps, enabled=rank == 0)
        curves = Curves()
        for step in range(config.steps):
            tokens, targets = batch(
                corpus.train, config.batch_size, config.model.context, generator
            )
            before = _totals(counters)
            start = time.perf_counter()
            loss = _loss(model, tokens, targets)
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            curves.step_seconds.append(time.perf_counter() - start)
            after = _totals(counters)
            curves.comm_seconds.append(after["seconds"] - before["seconds"])
            curves.exposed_seconds.append(after["exposed_seconds"] - before["exposed_seconds"])
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss, group=side)
            curves.losses.append(mean_loss.item() / world_size)
            progress.update(step, curves.losses[-1], curves.step_seconds[-1])
        traffic = [c.snapshot() for c in counters]  # the training's: not the evaluation's
        eval_loss = _evaluate(model, corpus, config)
        results.append(_summary(run, config, world_size, curves, eval_loss, counters, traffic))
        dist.barrier(side)
    return results if rank == 0 else None


@torch.no_grad()
def _evaluate(model, corpus: Corpus, config: TrainConfig) -> float:
    """Held-out loss on the same windows on every rank."""
    generator = torch.Generator().manual_seed(config.seed + 7)
    losses = []
    for _ in range(config.eval_batches):
        tokens, targets = batch(
            corpus.validation, config.batch_size, config.model.context, generator
        )
        losses.append(_loss(model, tokens, targets).item())
    return sum(losses) / len(losses)


def _totals(counters) -> dict[str, float]:
    """Seconds in collectives, and seconds the training thread waited for a low-rank
    hook (NaN where the integration does not measure it), summed over ``counters``."""
    snapshots = [c.snapshot() for c in counters]
    exposed = [s["exposed_seconds"] for s in snapshots if "exposed_seconds" in s]
    return {
        "seconds": sum(s["seconds"] for s in snapshots),
        "exposed_seconds": sum(exposed) if exposed else float("nan"),
    }


def _summary(run, config, world_size, curves: Curves, eval_loss, counters, traffic):
    losses, step_seconds = curves.losses, curves.step_seconds
    warmup = min(3, len(step_seconds) // 5)  # lazy initialisation, first kernel builds
    timed, comm = step_seconds[warmup:], curves.comm_seconds[warmup:]
    median = statistics.median(timed)
    tokens_per_step = world_size * config.batch_size * config.model.context
    return {
        "run": run.label,
        "all_gather": run.all_gather,
        "reduce_scatter": run.reduce_scatter,
        "strategy": config.strategy,
        "ranks": world_size,
        "steps": config.steps,
        "step_s": median,
        "tokens_per_s": tokens_per_step / median,
        "comm_fraction": sum(comm) / sum(timed) if counters else float("nan"),
        "exposed_ms": statistics.median(curves.exposed_seconds[warmup:]) * 1e3,
        "final_loss": sum(losses[-5:]) / len(losses[-5:]),
        "eval_loss": eval_loss,
        "wire_bytes": _total(traffic, "wire_bytes"),
        "raw_bytes": _total(traffic, "raw_bytes"),
        "losses": losses,
        "step_times": step_seconds,
    }


def _total(traffic: list[dict], key: str) -> float:
    """``key`` summed over the counters' snapshots; NaN without counters (torch's own
    PowerSGD hook sends bytes that no counter of ours sees: not none)."""
    return sum(t[key] for t in traffic) if traffic else float("nan")
