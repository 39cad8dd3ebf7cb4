"""Uniform noise for stochastic rounding: fresh on every call, different on every rank.

Unbiased rounding only averages out when the errors of different calls and of different
ranks are independent. So each codec instance keeps one generator per (device, process
rank), created on first use and advanced by every draw; its seed mixes the codec's
``seed`` with what its noise is for (the codec's kind and block: ``int8`` and ``int4``
with one seed draw apart), the rank (in torch.distributed's default group, 0 when it is
not initialized) and the device. The same seed, codec, rank, device and sequence of draws
give the same noise. :func:`snapshot` and :func:`restore` save a rank's streams and continue
them, so that a run resumed from a checkpoint draws what the uninterrupted run would.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from commpress.ranks import RANKS_KEY, check_saved_here, keyed_by_rank, own_entry
from commpress.seeds import seed_of

#: Generators are created at most once per key, even when the communication thread and
#: the caller encode with the same codec at the same time (drawing is thread safe in torch).
_creation_lock = threading.Lock()

Generators = dict[tuple[torch.device, int], torch.Generator]


def process_rank() -> int:
    """This process's rank in the default process group; 0 without torch.distributed."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def stream_seed(seed: int, stream: str, rank: int, device: torch.device) -> int:
    """A 63-bit seed for one (seed, stream, rank, device): a hash, so that no two tuples
    collide the way ``seed + rank`` would (seed 1 on rank 0 against seed 0 on rank 1)."""
    return seed_of("commpress-stochastic-rounding", seed, stream, rank, device)


def uniform(
    generators: Generators, seed: int, stream: str, shape: tuple[int, ...], device
) -> torch.Tensor:
    """U[0, 1) noise of ``shape`` on ``device`` from the generator in ``generators`` for this
    process's rank and ``device``, created from ``seed`` and ``stream`` (what the noise is
    for) on first use."""
    device = torch.device(device)
    rank = process_rank()
    key = (device, rank)
    generator = generators.get(key)
    if generator is None:
        with _creation_lock:
            generator = generators.get(key)
            if generator is None:
                generator = torch.Generator(device=device)
                generator.manual_seed(stream_seed(seed, stream, rank, device))
                generators[key] = generator
    return torch.rand(shape, generator=generator, dtype=torch.float32, device=device)


#: What every :func:`snapshot` holds.
STATE_KEYS = ("codec", "seed", "rank", "world_size", "streams")


def world_size() -> int:
    """The default process group's size; 1 without torch.distributed."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def snapshot(generators: Generators, codec: str, seed: int) -> dict:
    """This process rank's streams in ``generators`` (those that have drawn), as plain
    tensors and ints under the rank's key (:func:`~commpress.ranks.keyed_by_rank`: for
    ``torch.save`` or ``torch.distributed.checkpoint``), with what :func:`restore` checks."""
    rank = process_rank()
    with _creation_lock:
        streams = {str(device): g.get_state() for (device, r), g in generators.items() if r == rank}
    own = {"codec": codec, "seed": seed, "rank": rank, "world_size": world_size()}
    return keyed_by_rank({**own, "streams": streams}, rank)


def restore(generators: Generators, codec: str, seed: int, state: dict) -> None:
    """Continue this rank's streams from ``state`` (a :func:`snapshot` of the same codec, seed,
    rank and world size, or its entry alone, as one was saved before they were keyed); a
    device that had not drawn when it was taken starts over."""
    rank = process_rank()
    if isinstance(state, dict) and RANKS_KEY not in state and "streams" in state:
        own = state
    else:
        own = own_entry(state, rank, "rounding_state()")
    check_state(own, codec, seed)
    restored = {}
    for name, tensor in own["streams"].items():
        device = _drawing_device(name)
        try:
            generator = torch.Generator(device=device)
            generator.set_state(tensor.cpu())  # loaded with map_location="cuda", say
        except RuntimeError as error:  # no such device here, or not a generator's state
            raise ValueError(f"state['streams'][{name!r}] cannot be loaded here: {error}") from None
        restored[(device, rank)] = generator
    with _creation_lock:
        for key in [key for key in generators if key[1] == rank]:
            del generators[key]
        generators.update(restored)


def _drawing_device(name: object) -> torch.device:
    """The device of a saved stream, as draws name it (a tensor's ``device``: ``cpu``
    without an index, ``cuda:N`` with one); a name no draw would use is refused rather
    than loaded into a stream that is never drawn from."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"state['streams'] has {name!r}, which names no device") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.index is None:
        raise ValueError(
            f"state['streams'] has {name!r} without a device index: a rank's streams are "
            f"saved per device, as {device.type}:N"
        )
    return device


def check_state(state: dict, codec: str, seed: int) -> None:
    """``state``, a rank's entry of a :func:`snapshot`, was saved here, by an equal codec."""
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"state is not a codec's rounding_state(): it lacks {missing}")
    if state["seed"] != seed:
        raise ValueError(
            f"state was saved by a codec with seed={state['seed']}, this one ({codec!r}) has "
            f"seed={seed}: its streams would continue another seed's noise"
        )
    if state["codec"] != codec:
        raise ValueError(f"state holds the streams of codec {state['codec']!r}, this is {codec!r}")
    check_saved_here(
        state, process_rank(), world_size(), "a rank's streams are seeded by its rank in its world"
    )
    streams = state["streams"]
    if not isinstance(streams, dict) or not all(
        isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in streams.values()
    ):
        raise ValueError("state['streams'] must map device names to uint8 generator states")
