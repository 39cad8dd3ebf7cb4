"""Uniform noise for stochastic rounding: fresh on every call, different on every rank.

Unbiased rounding only averages out when the errors of different calls and of different
ranks are independent. So each codec instance keeps one generator per (device, process
rank), created on first use and advanced by every draw; its seed mixes the codec's
``seed`` with the rank (in torch.distributed's default group, 0 when it is not
initialized) and the device. The same seed, rank, device and sequence of draws give
the same noise.
"""

from __future__ import annotations

import hashlib
import threading

import torch
import torch.distributed as dist

#: Generators are created at most once per key, even when the communication thread and
#: the caller encode with the same codec at the same time (drawing is thread safe in torch).
_creation_lock = threading.Lock()

Generators = dict[tuple[torch.device, int], torch.Generator]


def process_rank() -> int:
    """This process's rank in the default process group; 0 without torch.distributed."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def stream_seed(seed: int, rank: int, device: torch.device) -> int:
    """A 63-bit seed for one (seed, rank, device): a hash, so that no two tuples collide
    the way ``seed + rank`` would (seed 1 on rank 0 against seed 0 on rank 1)."""
    text = f"commpress-stochastic-rounding/{seed}/{rank}/{device}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def uniform(generators: Generators, seed: int, shape: tuple[int, ...], device) -> torch.Tensor:
    """U[0, 1) noise of ``shape`` on ``device`` from the generator in ``generators`` for this
    process's rank and ``device``, created from ``seed`` on first use."""
    device = torch.device(device)
    rank = process_rank()
    key = (device, rank)
    generator = generators.get(key)
    if generator is None:
        with _creation_lock:
            generator = generators.get(key)
            if generator is None:
                generator = torch.Generator(device=device)
                generator.manual_seed(stream_seed(seed, rank, device))
                generators[key] = generator
    return torch.rand(shape, generator=generator, dtype=torch.float32, device=device)
