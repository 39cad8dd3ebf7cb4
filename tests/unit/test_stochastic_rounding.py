"""Stochastic rounding draws fresh noise on every call and on every rank, reproducibly.

Unbiased rounding only helps when its errors are independent: the mean of k encodes of
the same tensor must approach the tensor like 1/sqrt(k), which it cannot do if every call
(or every rank) repeats the same noise.
"""

from __future__ import annotations

import dataclasses
import io
import math

import pytest
import torch

import commpress as cp
from commpress.codecs import rounding_noise

SPECS = ["int8:stochastic=true,block=64", "int4:stochastic=true,block=64"]


def values() -> torch.Tensor:
    """Values strictly between grid points, so every element is rounded at random."""
    x = torch.linspace(-0.93, 0.93, 4096, dtype=torch.float32)
    x[::64] = 1.0  # each block's absmax, exactly on the grid
    return x


def mean_error(decodes: list[torch.Tensor], x: torch.Tensor) -> float:
    """RMS distance between the mean of the decodes and ``x``, over the rounded elements."""
    mean = torch.stack([d.double() for d in decodes]).mean(dim=0)
    rounded = x != 1.0
    return (mean - x.double())[rounded].pow(2).mean().sqrt().item()


def encodes_through_the_registry(spec: str, x: torch.Tensor, calls: int) -> list[torch.Tensor]:
    """What successive collectives do: look the codec up by its spec on every call."""
    return [
        cp.get_codec(spec).decode(cp.get_codec(spec).encode(x), x.numel(), x.dtype)
        for _ in range(calls)
    ]


@pytest.mark.parametrize("spec", SPECS)
def test_the_mean_over_calls_converges_like_one_over_sqrt_k(spec):
    x = values()
    few = mean_error(encodes_through_the_registry(spec, x, 16), x)
    many = mean_error(encodes_through_the_registry(spec, x, 256), x)
    # 16x the draws: the error of the mean shrinks 4x; repeated noise would not shrink at all.
    assert 2.5 < few / many < 6.5, (few, many)


def test_the_convergence_check_fails_for_noise_that_repeats():
    """The check above is not vacuous: a codec rebuilt for every call (seed 0 each time, the
    old behaviour) repeats its noise, and the error of the mean does not shrink."""
    x = values()
    spec = SPECS[0]

    def rebuilt(calls: int) -> list[torch.Tensor]:
        fresh = [dataclasses.replace(cp.get_codec(spec)) for _ in range(calls)]
        return [c.decode(c.encode(x), x.numel(), x.dtype) for c in fresh]

    few, many = mean_error(rebuilt(16), x), mean_error(rebuilt(256), x)
    assert not 2.5 < few / many < 6.5
    assert few == pytest.approx(many)


def test_every_spec_text_of_one_codec_shares_one_noise_stream():
    codec = cp.get_codec("int8:stochastic=true,seed=3")
    assert cp.get_codec("int8:stochastic=true,seed=3,block=256") is codec
    x = values()
    assert not torch.equal(codec.encode(x), codec.encode(x))


def test_a_new_instance_reproduces_the_same_stream_from_its_seed():
    base = cp.get_codec("int8:stochastic=true,seed=5")
    first, second = dataclasses.replace(base), dataclasses.replace(base)
    other = dataclasses.replace(base, seed=6)
    x = values()
    for _ in range(3):
        payload = first.encode(x)
        assert torch.equal(payload, second.encode(x))
        assert not torch.equal(payload, other.encode(x))


def test_seeds_of_different_ranks_and_seeds_never_coincide():
    cpu = torch.device("cpu")
    seeds = {
        rounding_noise.stream_seed(seed, "int8:block=256", rank, cpu)
        for seed in range(64)
        for rank in range(64)
    }
    assert len(seeds) == 64 * 64  # seed + rank would collide (seed 1 rank 0 = seed 0 rank 1)
    assert all(0 <= s < 2**63 for s in seeds)


def test_two_codecs_with_one_seed_draw_independent_noise():
    """``int8`` and ``int4`` (or one kind with two blocks) used side by side, say for the
    parameters and the gradients, would otherwise round with the same noise; the
    implementations of one codec still share it (the fast paths are checked against the
    reference with it)."""
    cpu = torch.device("cpu")
    draws = {
        spec: dataclasses.replace(cp.get_codec(spec)).noise(4, cpu)
        for spec in (*SPECS, "int8:stochastic=true,block=128", f"{SPECS[0]},impl=reference")
    }
    int8, int4, other_block, reference = draws.values()
    assert not torch.equal(int8, int4)
    assert not torch.equal(int8[0], other_block[0, :64])
    assert torch.equal(int8, reference)


def test_round_to_nearest_draws_no_noise():
    codec = cp.get_codec("int8")
    assert codec.noise(4, torch.device("cpu")) is None
    assert math.isclose(codec.grid_error, 0.5)


@pytest.mark.parametrize("impl", ["fused", "compiled", "reference"])
@pytest.mark.parametrize("spec", SPECS)
def test_a_value_on_the_grid_is_never_rounded_away(spec, impl, monkeypatch):
    """The largest noise below 1 must leave a grid point where it is: ``-127 + u``
    rounded in fp32 is -126, whose floor moved a constant negative block by a step."""
    codec = cp.get_codec(f"{spec},impl={impl}")
    largest = 1.0 - 2.0**-24  # the largest value torch.rand draws in fp32
    monkeypatch.setattr(
        type(codec), "noise", lambda self, rows, device: torch.full((rows, self.block), largest)
    )
    extremes = torch.tensor([-1.5, 1.5, 0.0, -1.5]).repeat(16)  # codes -qmax, qmax and 0
    for x in (torch.full((128,), -1.5), extremes):
        decoded = codec.decode(codec.encode(x), x.numel(), torch.float32)
        assert torch.equal(decoded, x)


def test_a_value_just_past_the_largest_code_stays_in_range():
    """An approximate division (CUDA's compiled path divides so) can scale a block's absmax
    to just past qmax; rounded up, that was code 128 for int8 (and a nibble of 16 for int4,
    which spills into its neighbour)."""
    from commpress.codecs.blockwise import round_to_integers

    v = torch.tensor([127.0 + 2.0**-16, -127.0 - 2.0**-16, 7.0 + 2.0**-20])
    largest = torch.full((3,), 1.0 - 2.0**-24)
    assert round_to_integers(v[:2], largest[:2], 127.0).tolist() == [127.0, -127.0]
    assert round_to_integers(v[2:], largest[2:], 7.0).tolist() == [7.0]


def saved_and_loaded(state: dict) -> dict:
    """``state`` through ``torch.save`` and ``torch.load`` (weights only, its default)."""
    file = io.BytesIO()
    torch.save(state, file)
    file.seek(0)
    return torch.load(file, weights_only=True)


def test_a_loaded_rounding_state_continues_the_saved_stream_bit_for_bit():
    codec = dataclasses.replace(cp.get_codec("int8:stochastic=true,seed=7,block=64"))
    x = values()
    for _ in range(2):
        codec.encode(x)  # the stream moves on from its seed
    state = saved_and_loaded(codec.rounding_state())
    uninterrupted = [codec.encode(x) for _ in range(3)]
    fresh = dataclasses.replace(codec)  # a new process's codec, without the saved state
    from_seed = [fresh.encode(x) for _ in range(3)]
    resumed = dataclasses.replace(codec)
    resumed.encode(x)  # a stream that drew before the load (not as far) is replaced
    resumed.load_rounding_state(state)
    for payload, expected, replayed in zip(
        [resumed.encode(x) for _ in range(3)], uninterrupted, from_seed, strict=True
    ):
        assert torch.equal(payload, expected)
        assert not torch.equal(payload, replayed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_loaded_cuda_rounding_state_continues_the_saved_stream_bit_for_bit():
    codec = dataclasses.replace(cp.get_codec("int8:stochastic=true,seed=7,block=64"))
    x = values().cuda()
    codec.encode(x)
    state = saved_and_loaded(codec.rounding_state())
    assert list(_entry(state)["streams"]) == [str(x.device)]  # cuda:N, the key draws use
    uninterrupted = [codec.encode(x) for _ in range(3)]
    resumed = dataclasses.replace(codec)
    resumed.load_rounding_state(state)
    fresh = dataclasses.replace(codec)
    for payload, expected, replayed in zip(
        [resumed.encode(x) for _ in range(3)], uninterrupted, [fresh.encode(x) for _ in range(3)],
        strict=True,
    ):  # fmt: skip
        assert torch.equal(payload, expected)
        assert not torch.equal(payload, replayed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_rounding_state_loaded_onto_the_gpu_continues_the_saved_stream(device):
    """``torch.load(..., map_location="cuda")`` puts the saved generator states on the GPU,
    and ``Generator.set_state`` takes a CPU tensor only ("RNG state must be a
    torch.ByteTensor")."""
    codec = dataclasses.replace(cp.get_codec("int8:stochastic=true,seed=7,block=64"))
    x = values().to(device)
    codec.encode(x)
    file = io.BytesIO()
    torch.save(codec.rounding_state(), file)
    file.seek(0)
    state = torch.load(file, map_location="cuda")
    uninterrupted = [codec.encode(x) for _ in range(3)]
    resumed = dataclasses.replace(codec)
    resumed.load_rounding_state(state)
    for payload, expected in zip([resumed.encode(x) for _ in range(3)], uninterrupted, strict=True):
        assert torch.equal(payload, expected)


def test_a_rank_entry_saved_before_states_were_keyed_by_rank_still_loads():
    codec = dataclasses.replace(cp.get_codec("int8:stochastic=true,seed=7,block=64"))
    x = values()
    codec.encode(x)
    entry = _entry(saved_and_loaded(codec.rounding_state()))  # what rounding_state() was
    expected = codec.encode(x)
    resumed = dataclasses.replace(codec)
    resumed.load_rounding_state(entry)
    assert torch.equal(resumed.encode(x), expected)


def test_a_stream_that_had_not_drawn_when_saved_starts_over_from_its_seed():
    codec = dataclasses.replace(cp.get_codec("int4:stochastic=true,block=64"))
    state = codec.rounding_state()
    assert _entry(state)["streams"] == {}
    x = values()
    first = codec.encode(x)
    codec.load_rounding_state(state)
    assert torch.equal(codec.encode(x), first)


def test_a_rounding_state_holds_only_the_streams_of_the_rank_it_is_taken_on(monkeypatch):
    """A process that drew as rank 1 and then as rank 0 (its process group gone) keeps a
    stream for each: the state it saves as rank 1 holds rank 1's, not rank 0's under the
    same device name."""
    codec = dataclasses.replace(cp.get_codec("int8:stochastic=true,block=64"))
    rank = [1]
    monkeypatch.setattr(rounding_noise, "process_rank", lambda: rank[0])
    for _ in range(3):
        codec.encode(values())
    rank[0] = 0
    codec.encode(values())  # rank 0's stream, made after rank 1's
    rank[0] = 1
    ((entry,),) = [codec.rounding_state()["of_rank"]["1"]]
    own = codec._generators[torch.device("cpu"), 1].get_state()
    assert list(entry["streams"]) == ["cpu"] and torch.equal(entry["streams"]["cpu"], own)
    assert not torch.equal(own, codec._generators[torch.device("cpu"), 0].get_state())


def _entry(state: dict) -> dict:
    """This rank's entry of a rounding state (rank 0: no process group here)."""
    ((entry,),) = [state["of_rank"]["0"]]
    return entry


def _misloaded(edit, whole: bool = False):
    """A load of this codec's own state, its entry (or, ``whole``, the state) edited by
    ``edit``."""

    def load():
        codec = cp.get_codec("int8:stochastic=true,seed=7")
        state = codec.rounding_state()
        if whole:
            codec.load_rounding_state(edit(state))
        else:
            codec.load_rounding_state({"of_rank": {"0": (edit(dict(_entry(state))),)}})

    return load


@pytest.mark.parametrize(
    ("load", "error", "words"),
    [
        (
            lambda: cp.get_codec("int8:stochastic=true,seed=8").load_rounding_state(
                cp.get_codec("int8:stochastic=true,seed=7").rounding_state()
            ),
            ValueError,
            "state was saved by a codec with seed=7, this one .* has seed=8",
        ),
        (
            lambda: cp.get_codec("int8:stochastic=true").load_rounding_state(
                cp.get_codec("int4:stochastic=true").rounding_state()
            ),
            ValueError,
            "state holds the streams of codec 'int4:stochastic=true'",
        ),
        (_misloaded(lambda s: {**s, "rank": 1}), ValueError, "state was saved by rank 1"),
        (
            _misloaded(lambda s: {"of_rank": {"1": s["of_rank"]["0"]}}, whole=True),
            ValueError,
            "state was saved by rank 1, this is rank 0",
        ),
        (
            _misloaded(lambda s: {"of_rank": {"0": _entry(s)}}, whole=True),
            ValueError,
            r"state\['of_rank'\]\['0'\] must be a tuple of one dict",
        ),
        (_misloaded(lambda s: {**s, "world_size": 2}), ValueError, "state .* of 2 processes"),
        (_misloaded(lambda s: {"weight": torch.ones(1)}), ValueError, "state .* lacks"),
        (_misloaded(lambda s: {**s, "streams": {"cpu": 0}}), ValueError, r"state\['streams'\]"),
        (_misloaded(lambda s: [s], whole=True), TypeError, "state must be the dict"),
        (_misloaded(lambda s: {"weight": torch.ones(1)}, whole=True), ValueError, "lacks"),
        (
            _misloaded(lambda s: {**s, "streams": {"cpu": torch.zeros(3, dtype=torch.uint8)}}),
            ValueError,
            r"state\['streams'\]\['cpu'\] cannot be loaded here",
        ),
        (
            _misloaded(lambda s: {**s, "streams": {"cuda": torch.Generator().get_state()}}),
            ValueError,
            "without a device index",
        ),
        (
            _misloaded(lambda s: {**s, "streams": {"cpus": torch.Generator().get_state()}}),
            ValueError,
            "names no device",
        ),
    ],
    ids=[
        *("seed", "codec", "rank", "rank_key", "entry_not_a_tuple", "world_size"),
        *("not_a_state", "streams", "not_a_dict", "not_keyed"),
        *("not_a_generator_state", "no_device_index", "no_device"),
    ],
)
def test_a_rounding_state_of_another_codec_seed_rank_or_world_is_refused(load, error, words):
    with pytest.raises(error, match=words):
        load()
