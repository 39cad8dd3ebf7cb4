"""The bench's inputs, the result they must give, and how far a correct result may be from it.

Rank r's input is N(0, 1) drawn from a generator seeded with r, so every rank can rebuild
every other's and knows the exact result (summed in float64). ``#wrong`` counts the
output elements farther from it than :func:`error_bound` allows.

The bound follows each algorithm's roundings, with ``E(v)`` the codec's
``error_bound`` (one encode and decode of values ``v``; it grows with ``|v|`` element
by element, so evaluating it on an upper bound of ``|v|`` bounds the error), ``u`` the
unit roundoff (fp32 2**-24, fp16 2**-11, bf16 2**-8) and ``S`` the exact sum:

* every fp32 addition ``a + b`` errs by at most ``u32 |a + b|``;
* ``ring``/``ring-hop`` reduce-scatter: the chunk's partial sum ``P_k`` of k contributions
  (in ring order) is encoded at hop k = 1..n-1, in ``partial_sum_dtype`` (fp32 for a lossy
  codec, so ``E(|P_k| + b_k)``; the input's 16-bit dtype for ``none``, so a rounding
  ``u |P_k|``), ``b_k`` being the error accumulated so far: each hop re-quantizes a
  partial sum, and the errors add up;
* ``alltoall``: each of the n - 1 other contributions is encoded once (``E(x_r)``), then
  n - 1 fp32 additions;
* all-gather (and all-reduce's second half): each shard is encoded once, its decode
  rounding to the output dtype. ``ring-hop`` re-encodes it at every hop it travelled, but
  runs only codecs whose decoded values encode to themselves (``codec.idempotent``; the
  collective refuses the others), so those re-encodes add nothing: its result is the
  ring's, bit for bit (a codec that is not idempotent would add one error per hop);
* a fp32 result written to a 16-bit output rounds once more: ``u |S + b|``;
* ``native`` sums in any order, in the input dtype or in fp32 rounded once:
  ``n u Sigma|x_r| / (1 - n u)`` (the classic bound of a sum of n terms, plus that rounding).

Rounding near zero adds half the dtype's subnormal spacing. Non-finite or out-of-range
(fp16 > 65504) values are outside these bounds: the bench's inputs have none.
"""

from __future__ import annotations

import torch

from commpress.codecs import get_codec
from commpress.schedules import Then, partial_sum_dtype, plan

U32 = 2.0**-24


def bench_input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s input: any rank can rebuild any other's."""
    generator = torch.Generator().manual_seed(rank)
    return torch.randn(numel, generator=generator).to(dtype)


def count_wrong(out: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> int:
    """Elements of ``out`` farther than ``bound`` from ``expected`` (NaN counts as wrong)."""
    within = (out.double() - expected).abs() <= bound
    return int((~within).sum())


def expected(op: str, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    """The exact (float64) output of rank ``rank``, given every rank's input."""
    if op == "all_gather":
        return torch.cat(inputs).double()
    total = _exact_sum(inputs)
    if op == "reduce_scatter":
        return total.view(len(inputs), -1)[rank]
    return total


def error_bound(
    op: str, algorithm: str, codec, inputs: list[torch.Tensor], rank: int
) -> torch.Tensor:
    """Per-element bound (float64) on ``|output - expected|`` for rank ``rank``'s output."""
    n, dtype = len(inputs), inputs[0].dtype
    if algorithm == "native":
        if op == "all_gather":
            return torch.zeros(n * inputs[0].numel(), dtype=torch.float64)
        parts = _chunks(inputs, rank) if op == "reduce_scatter" else inputs
        return _summation_error(n, dtype, sum(x.double().abs() for x in parts))
    codec = get_codec(codec)
    if op == "all_gather":
        shards = [
            _trips_error(codec, algorithm, x.double().abs(), owner, rank, n, dtype)
            for owner, x in enumerate(inputs)
        ]
        return torch.cat(shards)
    if op == "reduce_scatter":
        total, bound = _reduction_error(algorithm, codec, _chunks(inputs, rank), rank, dtype)
        return bound + _rounding(dtype, total.abs() + bound)
    return _all_reduce_error(algorithm, codec, inputs, rank)


def _all_reduce_error(algorithm, codec, inputs, rank) -> torch.Tensor:
    """Reduce-scatter of the padded chunks, then the ring all-gather of each reduced chunk
    in ``partial_sum_dtype`` (narrowed to it first), then the copy to the output dtype."""
    n, numel, dtype = len(inputs), inputs[0].numel(), inputs[0].dtype
    chunk = -(-numel // n)
    padded = [torch.nn.functional.pad(x, (0, n * chunk - numel)) for x in inputs]
    gathered = partial_sum_dtype(codec, dtype)
    bounds = []
    for owner in range(n):
        total, bound = _reduction_error(algorithm, codec, _chunks(padded, owner), owner, dtype)
        bound = bound + _rounding(gathered, total.abs() + bound)
        magnitude = total.abs() + bound
        bound = bound + _trips_error(codec, algorithm, magnitude, owner, rank, n, gathered)
        if gathered != dtype:
            bound = bound + _rounding(dtype, total.abs() + bound)
        bounds.append(bound)
    return torch.cat(bounds)[:numel]


def _reduction_error(algorithm, codec, parts, owner, dtype):
    """``(exact sum, bound on the fp32 sum's error)`` of one chunk; ``parts``: each rank's
    slice of it (float64). See the module doc for the derivation."""
    n = len(parts)
    (schedule,) = plan("reduce_scatter", algorithm, owner, n, n * parts[0].numel(), dtype, codec)
    receives = [receive for step in schedule.steps for receive in step.receives]
    if any(receive.then is Then.SUM for receive in receives):
        coded = sum(
            (_codec_error(codec, p.abs(), p.numel()) for r, p in enumerate(parts) if r != owner),
            torch.zeros_like(parts[0]),
        )
        magnitude = sum(p.abs() for p in parts)
        return sum(parts), coded + (n - 1) * U32 * (magnitude + coded)
    sent = partial_sum_dtype(codec, dtype)
    piece = max((receive.numel for receive in receives), default=0) or 1
    order = ring_order(owner, n)
    partial, bound = parts[order[0]].clone(), torch.zeros_like(parts[0])
    for r in order[1:]:
        magnitude = partial.abs() + bound  # of the partial sum encoded for the next hop
        bound = bound + _codec_error(codec, magnitude, piece) + _rounding(sent, magnitude)
        partial += parts[r]
        bound = bound + U32 * (partial.abs() + bound)
    return partial, bound


def ring_order(chunk: int, world_size: int) -> list[int]:
    """Ranks in the order the ring adds their contributions to ``chunk`` (its owner last),
    read from the ring's schedules."""
    if world_size == 1:
        return [chunk]
    rounds = [
        plan("reduce_scatter", "ring-hop", r, world_size, world_size, torch.float32, "none")[
            0
        ].steps
        for r in range(world_size)
    ]
    first = next(r for r in range(world_size) if rounds[r][0].sends[0].chunk == chunk)
    return [first] + [
        next(r for r in range(world_size) if rounds[r][s].receives[0].chunk == chunk)
        for s in range(world_size - 1)
    ]


def _trips_error(codec, algorithm, magnitude, owner, rank, n, decoded) -> torch.Tensor:
    """Error of a ring all-gather's copy of ``owner``'s shard (values of at most
    ``magnitude``) at ``rank``: one encode and decode to ``decoded``; with ``ring-hop`` and
    a codec that is not idempotent, one per hop it travelled (an idempotent codec
    re-encodes a decoded value to itself: the later hops change nothing)."""
    hops = algorithm == "ring-hop" and not codec.idempotent
    trips = max(1, (rank - owner) % n) if hops else 1
    bound = torch.zeros_like(magnitude)
    for _ in range(trips):
        coded = _codec_error(codec, magnitude + bound, magnitude.numel())
        if not codec.lossless:  # a lossless payload holds values of ``decoded`` already
            coded = coded + _rounding(decoded, magnitude + bound + coded)
        bound = bound + coded
    return bound


def _codec_error(codec, magnitude: torch.Tensor, piece: int) -> torch.Tensor:
    """Bound on one encode/decode of values of at most ``magnitude``, ``piece`` at a time."""
    if codec.lossless or magnitude.numel() == 0:
        return torch.zeros_like(magnitude)
    narrowed = magnitude.float()
    upper = torch.nextafter(narrowed, torch.full_like(narrowed, torch.inf))  # >= magnitude
    return torch.cat([codec.error_bound(p) for p in upper.split(piece)]).double()


def _rounding(dtype: torch.dtype, magnitude: torch.Tensor) -> torch.Tensor:
    """Bound on rounding a fp32 value of at most ``magnitude`` to ``dtype`` (none for fp32)."""
    if dtype == torch.float32:
        return torch.zeros_like(magnitude)
    info = torch.finfo(dtype)
    return magnitude * (info.eps / 2) + info.tiny * info.eps / 2


def _summation_error(n: int, dtype: torch.dtype, magnitude: torch.Tensor) -> torch.Tensor:
    """Any order of n - 1 additions in ``dtype``, or in fp32 then rounded to ``dtype``."""
    info = torch.finfo(dtype)
    u = info.eps / 2
    return n * u / (1 - n * u) * magnitude + n * info.tiny * u


def _chunks(inputs: list[torch.Tensor], index: int) -> list[torch.Tensor]:
    return [x.view(len(inputs), -1)[index].double() for x in inputs]


def _exact_sum(inputs: list[torch.Tensor]) -> torch.Tensor:
    return sum(x.double() for x in inputs)
