"""Bytes on the wire, read from the schedules: the one source for the statistics of the
collectives, ``commpress bench`` (``wire(B)``, ``ideal_us``, busbw) and the FSDP, DDP and
low-rank counters."""

from __future__ import annotations

import functools

import torch

from commpress.codecs import get_codec
from commpress.schedules import payloads
from commpress.schedules.payloads import chunk_numel
from commpress.schedules.registry import NATIVE, plan
from commpress.schedules.steps import Schedule

#: What the argument check adds in front of each message where it rides in band (gloo).
HEADER_BYTES = 32


def wire_bytes(
    op: str,
    algorithm: str,
    codec,
    numel: int,
    world_size: int,
    dtype: torch.dtype,
    chunk_bytes: int | None = None,
    in_band_check: bool = False,
    window: int = 1,
) -> int:
    """Bytes each rank sends per call (the largest over ranks).

    ``numel`` is the rank's input (the shard of an all-gather, the whole tensor of a
    reduction). ``native`` counts what a bandwidth-optimal uncompressed ring sends
    (nccl-tests' busbw bytes): the ``ring`` schedule of codec ``none`` on the raw dtype,
    the same for every reduction's two halves. gloo's own reduce-scatter sends more.
    ``in_band_check``: add the argument check's headers (:func:`check_bytes`), as a call
    on gloo sends them, for an executor that keeps ``window`` steps in flight.
    """
    if chunk_bytes is None:
        chunk_bytes = payloads.DEFAULT_CHUNK_BYTES
    codec = str(get_codec(codec))
    sent = _wire_bytes(op, algorithm, codec, numel, world_size, dtype, chunk_bytes)
    if in_band_check and algorithm != NATIVE and world_size > 1:
        (first, *_) = plan(op, algorithm, 0, world_size, numel, dtype, codec, chunk_bytes)
        sent += check_bytes(first, window)
    return sent


def check_bytes(schedule: Schedule, window: int = 1) -> int:
    """What the in-band argument check adds to the first schedule of a call: a header on
    each message where it rides in the payloads (:func:`carries_check`), else one header
    sent alone before it (and a 16-byte all-reduce, not counted here)."""
    messages = len(schedule.steps) if carries_check(schedule, window) else 1
    return HEADER_BYTES * messages


def carries_check(schedule: Schedule, window: int) -> bool:
    """Whether the payloads of ``schedule`` carry the in-band check's headers: a chain
    (:attr:`~commpress.schedules.steps.Schedule.chains_right`) run one step at a time
    (``window`` 1, the executor's default); any other run sends one header alone."""
    return window == 1 and schedule.chains_right


@functools.lru_cache(maxsize=4096)
def _wire_bytes(op, algorithm, codec, numel, world_size, dtype, chunk_bytes) -> int:
    if algorithm == NATIVE:
        shard = numel if op == "all_gather" else chunk_numel(numel, world_size)
        halves = 2 if op == "all_reduce" else 1
        return halves * _wire_bytes(
            "all_gather", "ring-hop", "none", shard, world_size, dtype, chunk_bytes
        )
    # every registered schedule is rank-symmetric (tests/unit/test_sim.py), so rank 0 sends
    # as much as the busiest: planning every rank took minutes from a few thousand ranks
    schedules = plan(op, algorithm, 0, world_size, numel, dtype, codec, chunk_bytes)
    return sum(schedule.sent_bytes for schedule in schedules)


def busiest_link_bytes(
    op: str, algorithm: str, codec, numel: int, world_size: int, dtype: torch.dtype
) -> int:
    """The most bytes one host link carries in one direction per call, over ranks: what a
    link's rate bounds. A ring sends what it receives; a multicast root sends its shard
    once but receives every other rank's."""
    if algorithm == NATIVE:
        return wire_bytes(op, algorithm, codec, numel, world_size, dtype)
    codec = str(get_codec(codec))
    chunk_bytes = payloads.DEFAULT_CHUNK_BYTES
    return max(
        max(sum(s.sent_bytes for s in schedules), sum(s.received_bytes for s in schedules))
        for schedules in (
            plan(op, algorithm, rank, world_size, numel, dtype, codec, chunk_bytes)
            for rank in range(world_size)
        )
    )


def input_numel(op: str, size_bytes: int, world_size: int, dtype: torch.dtype) -> int:
    """A rank's input for a size as nccl-tests count it (an all-gather's whole output, a
    reduction's input), rounded down to whole elements split evenly over the ranks."""
    count = size_bytes // dtype.itemsize
    if op == "all_gather":
        return count // world_size
    if op == "reduce_scatter":
        return count - count % world_size
    return count


def moved_bytes(op: str, numel: int, world_size: int, dtype: torch.dtype) -> int:
    """The size, as nccl-tests count it, of a call whose rank input is ``numel``."""
    return numel * (world_size if op == "all_gather" else 1) * dtype.itemsize


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor compares a collective's
    bandwidth with the link's whatever n. It is native's wire bytes over the op's size:
    (n - 1) / n for all-gather and reduce-scatter, twice that for all-reduce."""
    n = world_size
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "all_reduce":
        return 2 * (n - 1) / n
    raise ValueError(f"unknown op {op!r}; known: all_gather, reduce_scatter, all_reduce")
