"""Properties every codec must have, checked on the reference path with hypothesis."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import commpress as cp

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
LOSSY_SPECS = [
    "bf16",
    "fp16",
    "int8:impl=reference",
    "int8:impl=reference,block=7",
    "int8:impl=reference,stochastic=true,seed=3",
    "int4:impl=reference",
    "int4:impl=reference,block=6,stochastic=true",
    "fp8:impl=reference",
    "fp8:impl=reference,block=33",
    "zfp:rate=8",
    "zfp:rate=16",
]
ALL_SPECS = ["none", *LOSSY_SPECS]


@st.composite
def tensors(draw, max_numel: int = 700):
    """Float tensors of every accepted dtype, sizes around block edges, varied scales."""
    numel = draw(st.integers(0, max_numel))
    dtype = draw(st.sampled_from(FLOATS))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([1e-30, 1e-3, 1.0, 300.0]))
    heavy_tailed = draw(st.booleans())
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=generator) * scale
    if heavy_tailed:  # Student-t with 2 degrees of freedom: occasional huge values
        x = x / torch.rand(numel, generator=generator).clamp_min(1e-3).sqrt()
    return x.clamp(-6e4, 6e4).to(dtype)


@pytest.mark.parametrize("spec", ALL_SPECS)
@settings(max_examples=40, deadline=None)
@given(x=tensors())
def test_payload_size_is_wire_bytes(spec, x):
    codec = cp.get_codec(spec)
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert payload.numel() == codec.wire_bytes(x.numel(), x.dtype)


@pytest.mark.parametrize("spec", LOSSY_SPECS)
@settings(max_examples=40, deadline=None)
@given(x=tensors())
def test_error_within_documented_bound(spec, x):
    codec = cp.get_codec(spec)
    decoded = codec.decode(codec.encode(x), x.numel(), torch.float32)
    error = (x.float() - decoded).abs()
    bound = codec.error_bound(x)
    assert torch.all(error <= bound), f"worst excess {(error - bound).max().item():.3e}"


#: Half an ulp of a 16-bit type, relative and (half its smallest subnormal) absolute.
HALF_ULP = {torch.bfloat16: (2.0**-8, 2.0**-134), torch.float16: (2.0**-11, 2.0**-25)}


@pytest.mark.parametrize("spec", LOSSY_SPECS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_to_a_16_bit_type_errs_by_the_bound_plus_one_rounding(spec, dtype):
    """docs/codecs.md: ``error_bound`` is the fp32 decode's; the decode to the input's own 16-bit
    type that a collective makes rounds once more, by half an ulp of the decoded value
    (int8 on bf16 data: up to about twice ``error_bound`` alone, the half ulp near absmax
    being about absmax/256)."""
    codec = cp.get_codec(spec)
    generator = torch.Generator().manual_seed(5)
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    subnormals = torch.randint(-250, 250, (2000,), generator=generator).double() * tiny
    x = torch.cat([torch.randn(2000, generator=generator).double(), subnormals]).to(dtype)
    decoded = codec.decode(codec.encode(x), x.numel(), dtype).float()
    relative, absolute = HALF_ULP[dtype]
    bound = codec.error_bound(x) + decoded.abs() * relative + absolute
    assert torch.all((decoded - x.float()).abs() <= bound)


@pytest.mark.parametrize("spec", LOSSY_SPECS)
@settings(max_examples=20, deadline=None)
@given(x=tensors(), out_dtype=st.sampled_from(FLOATS))
def test_decode_to_any_float_dtype_is_fp32_decode_rounded(spec, x, out_dtype):
    codec = cp.get_codec(spec)
    payload = codec.encode(x)
    as_fp32 = codec.decode(payload, x.numel(), torch.float32)
    direct = codec.decode(payload, x.numel(), out_dtype)
    assert direct.dtype == out_dtype
    assert torch.equal(direct, as_fp32.to(out_dtype))


@pytest.mark.parametrize(
    "spec", ["int8", "int8:stochastic=true", "int4", "int4:stochastic=true", "fp8"]
)
@settings(max_examples=30, deadline=None)
@given(
    nblocks=st.integers(1, 9),
    tail=st.integers(0, 15),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 1000),
)
def test_blockwise_constant_input_is_exact(spec, nblocks, tail, dtype, seed):
    codec = cp.get_codec(spec + ("," if ":" in spec else ":") + "impl=reference,block=16")
    generator = torch.Generator().manual_seed(seed)
    levels = (torch.randn(nblocks + 1, generator=generator) * 8).round() / 4  # exact in 16 bits
    x = levels.repeat_interleave(16)[: nblocks * 16 + tail].to(dtype)
    decoded = codec.decode(codec.encode(x), x.numel(), dtype)
    assert torch.equal(decoded, x)


@pytest.mark.parametrize("spec", ["int8", "int4"])
def test_stochastic_rounding_is_unbiased(spec):
    codec = cp.get_codec(f"{spec}:impl=reference,stochastic=true,seed=11,block=64")
    nearest = cp.get_codec(f"{spec}:impl=reference,block=64")
    absmax = 1.0
    # Values strictly between grid points, where round-to-nearest is biased.
    x = torch.linspace(-0.93, 0.93, 64) * absmax
    x[0] = absmax
    draws = 2000
    total = torch.zeros(64, dtype=torch.float64)
    for _ in range(draws):
        total += codec.decode(codec.encode(x), 64, torch.float32).double()
    mean = total / draws
    step = absmax / codec.qmax
    tolerance = 5 * step / (2 * math.sqrt(draws))  # 5 sigma of a Bernoulli * step
    assert torch.all((mean - x.double()).abs() <= tolerance)
    # Pooled over each sign's rounded elements, a bias of a few hundredths of a step shows,
    # toward -inf or toward zero alike (noise scaled by 0.97 passed the check above).
    for side in (x > 0, x < 0):
        side &= x != absmax
        pooled = (mean - x.double())[side].mean()
        assert pooled.abs() <= 5 * step / (2 * math.sqrt(draws * int(side.sum())))
    # The same check rejects round-to-nearest, so it can fail.
    biased = nearest.decode(nearest.encode(x), 64, torch.float32).double()
    assert torch.any((biased - x.double()).abs() > tolerance)


def test_error_bound_is_the_bit_width_bound_for_int8():
    codec = cp.get_codec("int8:block=4,impl=reference")
    x = torch.tensor([0.1, -2.54, 1.0, 0.0, 3.0, 3.0, 3.0, 3.0])
    bound = codec.error_bound(x)
    # absmax / 254 plus fp32 rounding slack of absmax * 2**-20.
    expected = torch.tensor([2.54] * 4 + [3.0] * 4) * (1 / 254 + 2.0**-20)
    assert torch.allclose(bound, expected, rtol=1e-6)


def _documented_bound(spec: str, x: torch.Tensor) -> torch.Tensor:
    """docs/codecs.md's codec table, written out independently of the codecs' own arithmetic."""
    magnitude = x.float().abs()
    name, _, options = spec.partition(":")
    block = 4
    per_block = magnitude.view(-1, block).amax(dim=1).repeat_interleave(block)
    slack = per_block * 2.0**-20  # every bound also allows absmax * 2**-20 of fp32 rounding
    stochastic = "stochastic=true" in options
    if name == "int8":
        return per_block / (127 if stochastic else 254) + slack
    if name == "int4":
        return per_block / (7 if stochastic else 14) + slack
    if name == "fp8":
        return magnitude / 16 + per_block / 448 * 2.0**-10 + slack
    if name == "bf16":
        return magnitude * 2.0**-8 + 2.0**-134
    if name == "fp16":
        bound = magnitude * 2.0**-11 + 2.0**-25
        return torch.where(magnitude >= 65520, torch.inf, bound)
    rate = float(options.removeprefix("rate="))
    return per_block * 2.0 ** (7 - rate) + magnitude.max() * 2.0**-80


@pytest.mark.parametrize(
    "spec",
    [
        "int8:block=4",
        "int8:block=4,stochastic=true",
        "int4:block=4",
        "int4:block=4,stochastic=true",
        "fp8:block=4",
        "bf16",
        "fp16",
        "zfp:rate=8",
        "zfp:rate=16",
    ],
)
def test_error_bound_is_the_documented_one(spec):
    """The property tests above hold each codec to its own ``error_bound``: this holds that
    to docs/codecs.md's table, so that a looser bound cannot pass for a correct codec (fp8's
    relative error doubled, say, passed every other test)."""
    x = torch.tensor([0.1, -2.54, 1.0, 0.0, 3.0, 3.0, -3.0, 3.0, 1e-3, 7e4, -6e4, 2.0])
    assert torch.allclose(
        cp.get_codec(spec).error_bound(x), _documented_bound(spec, x), rtol=1e-6, atol=0
    )
