"""Edge cases, non-finite values and bad input for every codec."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

import commpress as cp
from commpress import _torch_private
from commpress.codecs import registry
from commpress.schedules import wire
from commpress.testing import assert_same_bits

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
LOSSY = ["bf16", "fp16", "int8", "int4", "fp8", "zfp:rate=16"]
REFERENCE = {"int8", "int4", "fp8"}


def make(spec: str):
    """The reference path for block codecs keeps these tests free of compilation."""
    return cp.get_codec(spec + ":impl=reference" if spec in REFERENCE else spec)


# ---------------------------------------------------------------- registry and specs


def test_list_codecs_names_every_codec():
    assert cp.list_codecs() == ["bf16", "fp16", "fp8", "int4", "int8", "none", "zfp"]


def test_spec_options_are_parsed_and_round_trip():
    codec = cp.get_codec("int8:block=128,stochastic=true,seed=7")
    assert (codec.block, codec.stochastic, codec.seed) == (128, True, 7)
    assert str(codec) == "int8:block=128,stochastic=true,seed=7"
    assert str(cp.get_codec("int8")) == "int8"
    assert cp.get_codec(str(codec)) == codec
    assert cp.get_codec(codec) is codec


def test_the_spec_made_once_follows_the_options_of_each_codec():
    codec = cp.get_codec("int8:impl=reference")
    assert str(codec) == "int8:impl=reference"
    assert str(dataclasses.replace(codec, block=64)) == "int8:block=64,impl=reference"
    assert str(dataclasses.replace(codec, impl="fused")) == "int8"
    assert str(cp.get_codec("int4:impl=reference")) == "int4:impl=reference"
    assert str(codec) == "int8:impl=reference"


def test_the_payload_sizes_a_codec_keeps_follow_numel_dtype_and_codec():
    """Encodes and decodes check their buffers against sizes each codec keeps per
    ``(numel, dtype)``: a size kept for one key is never taken for another."""
    none, int8 = cp.get_codec("none"), make("int8")
    for numel, dtype in [(10, torch.float32), (10, torch.float16), (12, torch.float32)] * 2:
        x = torch.ones(numel, dtype=dtype)
        for codec in (none, int8):
            size = codec.wire_bytes(numel, dtype)
            payload = codec.encode(x, out=torch.empty(size, dtype=torch.uint8))
            assert_same_bits(codec.decode(payload, numel, dtype), x)
            with pytest.raises(ValueError, match=f"of {size} bytes"):
                codec.encode(x, out=torch.empty(size + 1, dtype=torch.uint8))
            with pytest.raises(ValueError, match=f"into exactly {size} bytes"):
                codec.decode(torch.cat([payload, payload[:1]]), numel, dtype)
    assert none.wire_bytes(10, torch.float16) != none.wire_bytes(10, torch.float32)
    with pytest.raises(TypeError, match="int8"):  # a refused dtype is never kept
        int8.decode(torch.empty(14, dtype=torch.uint8), 10, torch.int32)


def test_a_codec_keeps_at_most_its_limit_of_payload_sizes():
    """A model's shapes, not every size ever asked: past the limit the kept sizes start
    over, and the sizes stay right."""
    from commpress.codecs.base import KEPT_WIRE_SIZES

    codec = make("int8")
    for numel in range(KEPT_WIRE_SIZES + 10):
        codec.payload_buffer(None, torch.empty(numel))
    assert 0 < len(codec._wire_sizes) <= KEPT_WIRE_SIZES
    assert codec.payload_buffer(None, torch.empty(300)).numel() == 300 + 2 * 4


@pytest.mark.parametrize("rate", [3.1249999, 7.1234567, 8.5, 16.0])
def test_a_float_option_round_trips_through_the_canonical_spec(rate):
    # str(codec) is what the schedules, the wire-byte counts and the argument check carry;
    # 6 digits made 3.1249999 read back as 3.125, whose zfp stream is a bit per block longer
    codec = cp.get_codec(f"zfp:rate={rate}")
    assert cp.get_codec(str(codec)) == codec
    numel = 4096
    sent = wire.wire_bytes("all_gather", "ring-hop", codec, numel, 2, torch.float32)
    payload = codec.encode(torch.randn(numel))
    assert sent == codec.wire_bytes(numel, torch.float32) == payload.numel()


@pytest.mark.parametrize(("before", "after"), [(" ", ""), ("\t", " "), (" ", "  ")])
def test_whitespace_around_a_specs_name_is_read_as_around_its_options(before, after):
    """``"int8 :block=4"`` was an unknown codec 'int8 ', where ``"int8: block=4"`` was
    read: the spaces around the name now count as little as those around each option, in
    every spec with options (codecs, the tuner's auto, topologies, low-rank algorithms)."""
    from commpress.lowrank.registry import get_algorithm
    from commpress.sim import tuner
    from commpress.sim.topology import check_topology
    from commpress.train.loop import Run

    def spaced(name, options):
        return f"{after}{name}{before}:{after}{options}"

    assert cp.get_codec(spaced("int8", "block=128")) == cp.get_codec("int8:block=128")
    auto = spaced("auto", "max_rel_err=1e-2")
    assert tuner.is_auto(auto) and tuner.budget(auto)[0] == 1e-2
    assert check_topology(spaced("racks", "count=4")) == ("racks", {"count": 4})
    lowrank = spaced("powersgd", "rank=2")
    assert get_algorithm(lowrank).rank == 2
    assert Run.parse(lowrank, "ddp").lowrank == lowrank


def test_unknown_codec_lists_known_names():
    with pytest.raises(ValueError, match=r"unknown codec 'int3'.*'int8'"):
        cp.get_codec("int3")


@pytest.mark.parametrize(
    ("spec", "algorithm"), [("int8@ring", "ring"), ("int4:block=64@alltoall", "alltoall")]
)
def test_a_codec_spec_with_an_algorithm_says_where_the_algorithm_goes(spec, algorithm):
    """``cp.all_reduce(t, codec="int8@ring")`` (README: a spec is
    ``CODEC[:options][@ALGORITHM]``) said "unknown codec 'int8@ring'", or for a spec with
    options that the option's value was bad ("block='64@alltoall' ... must be an int"),
    nothing of the '@'."""
    with pytest.raises(ValueError, match=f"codec spec '{spec}' names an algorithm") as got:
        cp.get_codec(spec)
    assert f"algorithm='{algorithm}'" in str(got.value), got.value


def test_unknown_option_lists_known_options():
    with pytest.raises(ValueError, match=r"unknown option 'bits'.*'block'.*'stochastic'"):
        cp.get_codec("int8:bits=4")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("int8:block=abc", "must be an int"),
        ("int8:block=0", "block must be a positive int"),
        ("int8:block=100000000000000000000", "block must be a positive int of at most"),
        ("int8:block=64,block=128", "option 'block' given twice"),
        ("int8:stochastic=maybe", "must be true or false"),
        ("int8:block", "key=value"),
        ("int4:block=7", "even block"),
        ("int4:block=1", "even block"),
        ("int8:impl=fast", "impl must be one of"),
        ("zfp:rate=1", r"rate must be in \[3, 32\]"),
        ("zfp:rate=x", "must be a float"),
    ],
)
def test_bad_option_values(spec, message):
    with pytest.raises(ValueError, match=message):
        cp.get_codec(spec)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"seed": True}, TypeError, "seed must be an int"),
        ({"seed": 1.0}, TypeError, "seed must be an int"),
        ({"stochastic": 1}, TypeError, "stochastic must be a bool"),
        ({"block": True}, ValueError, "block must be a positive int"),
        ({"block": 0}, ValueError, "block must be a positive int"),
    ],
)
def test_bad_option_values_given_to_a_codec_class_directly(options, error, message):
    """What a spec's parser refuses by type, the class refuses too (a bool is an int)."""
    with pytest.raises(error, match=message):
        registry._REGISTRY["int8"](**options)


def test_a_second_codec_of_a_registered_name_is_refused():
    class Again(type(cp.get_codec("int8"))):
        name = "int8"

    with pytest.raises(ValueError, match="'int8' is already registered"):
        registry.register(Again)
    assert registry._REGISTRY["int8"] is not Again  # not overwritten before the refusal
    assert type(cp.get_codec("int8:block=96")).__name__ == "Int8Codec"  # a spec not cached


@pytest.mark.parametrize(
    "spec, largest_finite, first_infinite",
    [
        # bf16 rounds to Inf from halfway between its largest, (2 - 2**-7) * 2**127, and 2**128
        ("bf16", (2.0 - 2.0**-7) * 2.0**127, (2.0 - 2.0**-8) * 2.0**127),
        ("fp16", 65504.0, 65520.0),  # halfway between 65504 and 65536
    ],
)
def test_the_error_bound_is_infinite_from_the_first_value_that_rounds_to_inf(
    spec, largest_finite, first_infinite
):
    codec = cp.get_codec(spec)
    below = torch.nextafter(torch.tensor(first_infinite), torch.tensor(0.0)).item()
    x = torch.tensor([largest_finite, below, first_infinite, -first_infinite])
    decoded = codec.decode(codec.encode(x), 4, torch.float32)
    bound = codec.error_bound(x)
    assert torch.isfinite(decoded[:2]).all() and torch.isinf(decoded[2:]).all()
    assert torch.isfinite(bound[:2]).all() and torch.isinf(bound[2:]).all()
    assert ((decoded[:2] - x[:2]).abs() <= bound[:2]).all()
    assert decoded[0] == largest_finite and bound[0] == largest_finite * codec.relative_error + (
        codec.absolute_error
    )


def test_a_payload_at_an_odd_address_is_not_aligned_whatever_its_offset():
    """``is_aligned`` looks at the address too: a tensor made on a buffer at an odd
    address has storage offset 0 (torch's view would accept it), a kernel would not."""
    from commpress.codecs.base import is_aligned, view_as_dtype

    buffer = torch.zeros(17, dtype=torch.uint8)
    odd = torch.frombuffer(memoryview(buffer.numpy())[1:], dtype=torch.uint8)
    assert odd.storage_offset() == 0 and odd.data_ptr() % 2 == 1
    assert not is_aligned(odd, torch.float32) and not is_aligned(odd, torch.bfloat16)
    assert is_aligned(odd, torch.uint8) and is_aligned(buffer[4:], torch.float32)
    assert view_as_dtype(odd[:16], torch.float32).data_ptr() % 4 == 0


def test_spec_must_be_a_string():
    with pytest.raises(TypeError, match="codec spec"):
        cp.get_codec(8)


def test_zfp_without_zfpy_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "zfpy", None)
    # A fresh process: no shared instance built by an earlier test, when zfpy was there.
    monkeypatch.setattr(registry, "_SHARED", {})
    monkeypatch.setattr(registry, "_SHARED_BY_TEXT", {})
    with pytest.raises(ImportError, match=r"pip install 'commpress\[zfp\]'"):
        cp.get_codec("zfp")


# ---------------------------------------------------------------- sizes and dtypes


@pytest.mark.parametrize("spec", ["none", *LOSSY])
@pytest.mark.parametrize("numel", [0, 1, 2, 3, 255, 256, 257, 513])
def test_any_numel(spec, numel):
    codec = make(spec)
    x = torch.randn(numel)
    payload = codec.encode(x)
    assert payload.numel() == codec.wire_bytes(numel, torch.float32)
    decoded = codec.decode(payload, numel, torch.float32)
    assert decoded.shape == (numel,)
    assert torch.all((decoded - x).abs() <= codec.error_bound(x))


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int8, torch.uint8, torch.bool, torch.float64, torch.float16]
)
def test_none_is_bit_exact_for_any_dtype(dtype):
    x = (torch.randn(37, 3) * 100).to(dtype)
    codec = cp.get_codec("none")
    decoded = codec.decode(codec.encode(x), x.numel(), dtype)
    assert torch.equal(decoded.view(torch.uint8), x.reshape(-1).view(torch.uint8))


def test_none_sends_the_values_of_a_conjugate_view():
    codec = cp.get_codec("none")
    x = torch.randn(8, dtype=torch.complex64).conj()  # lazy: its memory holds x's conjugate
    assert torch.equal(codec.decode(codec.encode(x), 8, x.dtype), x.resolve_conj())


@pytest.mark.parametrize("spec", LOSSY)
def test_a_lazy_negation_is_encoded_with_its_sign(spec):
    """The imaginary part of a conjugate is a lazy negation, contiguous as one element:
    fp16 cast it into the payload without its sign."""
    x = torch.randn(4, dtype=torch.complex64).conj().imag[:1]
    codec = make(spec)
    decoded = codec.decode(codec.encode(x), 1, x.dtype)
    assert ((decoded - x).abs() <= codec.error_bound(x)).all()
    # whole blocks on the default path (the native kernels read the memory, not -x)
    values = torch.randn(512)
    negated, default = _torch_private.negative_view(values), cp.get_codec(spec)
    decoded = default.decode(default.encode(negated), 512, torch.float32)
    assert ((decoded + values).abs() <= default.error_bound(values)).all()


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_a_lazy_negation_as_out_receives_the_decoded_values(spec):
    """The native kernels wrote the decoded values into its memory, and torch's copy_ of
    fp16 into it drops the sign: int8, int4, fp8 and fp16 gave -x (whole blocks), and zfp,
    which copies its fp32 values into it, gave -x in fp16."""
    codec = cp.get_codec(spec)
    for dtype in FLOATS:
        payload = codec.encode(torch.randn(512).to(dtype))
        out = _torch_private.negative_view(torch.zeros(512, dtype=dtype))
        decoded = codec.decode(payload, 512, dtype, out=out)
        assert decoded.data_ptr() == out.data_ptr()
        assert_same_bits(out.resolve_neg(), codec.decode(payload, 512, dtype))


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_a_lone_element_of_a_strided_view_is_encoded(spec):
    """One element (or none) is contiguous whatever its stride: none's view of it as
    bytes refused a stride of 2."""
    codec = make(spec)
    for x in (torch.randn(8)[::2][:1], torch.randn(8)[::2][:0]):
        decoded = codec.decode(codec.encode(x), x.numel(), x.dtype)
        assert ((decoded - x).abs() <= codec.error_bound(x)).all()


@pytest.mark.parametrize("spec", ["none", *LOSSY])
@pytest.mark.parametrize("dtype", FLOATS)
def test_a_lone_element_of_a_strided_view_is_encoded_into_a_send_buffer_at_any_offset(spec, dtype):
    """bf16 and fp16 on their own type's lone element of a stride-2 view, into a payload at
    an odd offset (which they fill through a byte view of the cast input): torch refused
    the byte view of the stride-2 element, a RuntimeError."""
    codec = make(spec)
    for x in (torch.randn(8).to(dtype)[::2][:1], torch.randn(2, 2).to(dtype)[:1, 1:]):
        size = codec.wire_bytes(x.numel(), x.dtype)
        for offset in (0, 1, 3):
            buffer = torch.zeros(size + offset, dtype=torch.uint8)
            payload = codec.encode(x, out=buffer[offset:])
            assert torch.equal(payload, codec.encode(x.contiguous().view(-1)))
            decoded = codec.decode(payload, x.numel(), x.dtype)
            assert ((decoded.float() - x.reshape(-1).float()).abs() <= codec.error_bound(x)).all()


def test_none_keeps_nan_payloads_bit_exact():
    x = torch.tensor([float("nan"), -float("inf"), -0.0, 1.5])
    decoded = cp.get_codec("none").decode(cp.get_codec("none").encode(x), 4, torch.float32)
    assert torch.equal(decoded.view(torch.int32), x.view(torch.int32))


@pytest.mark.parametrize("spec, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_cast_codec_carries_its_own_dtype_exactly(spec, dtype):
    x = torch.randn(1001).to(dtype)
    codec = cp.get_codec(spec)
    assert torch.equal(codec.decode(codec.encode(x), x.numel(), dtype), x)


def test_fp16_overflows_to_signed_infinity_beyond_its_range():
    x = torch.tensor([65504.0, 65519.0, 65520.0, -1e6, 1e-9, 3e38])
    codec = cp.get_codec("fp16")
    decoded = codec.decode(codec.encode(x), x.numel(), torch.float32)
    expected = torch.tensor([65504.0, 65504.0, float("inf"), -float("inf"), 0.0, float("inf")])
    assert torch.equal(decoded, expected)
    assert torch.isinf(codec.error_bound(x)[2:4]).all()


def test_encode_does_not_alias_the_input():
    x = torch.randn(64)
    for spec in ["none", *LOSSY]:
        codec = make(spec)
        payload = codec.encode(x)
        before = payload.clone()
        x.add_(1.0)
        assert torch.equal(payload, before), spec


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_decode_of_misaligned_payload_slice(spec):
    codec = make(spec)
    x = torch.randn(300)
    payload = codec.encode(x)
    buffer = torch.zeros(payload.numel() + 3, dtype=torch.uint8)
    buffer[3:] = payload
    assert torch.equal(
        codec.decode(buffer[3:], 300, torch.float32), codec.decode(payload, 300, torch.float32)
    )


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_decode_into_out(spec):
    codec = make(spec)
    x = torch.randn(300)
    payload = codec.encode(x)
    out = torch.empty(300, dtype=torch.bfloat16)
    result = codec.decode(payload, 300, torch.bfloat16, out=out) if spec != "none" else None
    if result is not None:
        assert result.data_ptr() == out.data_ptr()
        assert torch.equal(out, codec.decode(payload, 300, torch.bfloat16))
    with pytest.raises(ValueError, match="out must hold 300 elements"):
        codec.decode(payload, 300, torch.float32, out=torch.empty(299))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("spec", LOSSY)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool, torch.complex64])
def test_lossy_codecs_reject_non_float_input(spec, dtype):
    with pytest.raises(TypeError, match=r"cannot take x.dtype"):
        make(spec).encode(torch.zeros(8, dtype=dtype))


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_payload_of_the_wrong_size_is_refused(spec):
    codec = make(spec)
    payload = codec.encode(torch.randn(100))
    with pytest.raises(ValueError, match=r"payload has \d+ bytes but .* exactly \d+ bytes"):
        codec.decode(payload[:-1], 100, torch.float32)
    with pytest.raises(ValueError, match=r"payload has"):
        codec.decode(payload, 101, torch.float32)


def test_payload_must_be_uint8():
    with pytest.raises(ValueError, match="1-D torch.uint8"):
        cp.get_codec("int8").decode(torch.zeros(10, dtype=torch.int8), 2, torch.float32)


def test_numel_must_be_non_negative_int():
    with pytest.raises(ValueError, match="numel must be a non-negative int"):
        cp.get_codec("int8").wire_bytes(-1, torch.float32)


# ---------------------------------------------------------------- NaN and Inf


@pytest.mark.parametrize("spec", LOSSY)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_values_stay_non_finite(spec, dtype, bad):
    x = torch.randn(1000).to(dtype)
    positions = torch.tensor([0, 257, 500, 999])
    x[positions] = bad
    codec = make(spec)
    decoded = codec.decode(codec.encode(x), x.numel(), dtype)
    assert not torch.isfinite(decoded[positions]).any()


@pytest.mark.parametrize("spec", ["int8", "int4", "fp8"])
def test_a_non_finite_value_poisons_only_its_own_block(spec):
    codec = cp.get_codec(spec + ":impl=reference,block=8")
    x = torch.ones(32)
    x[9] = float("inf")
    decoded = codec.decode(codec.encode(x), 32, torch.float32)
    assert torch.isnan(decoded[8:16]).all()
    assert torch.equal(decoded[:8], x[:8]) and torch.equal(decoded[16:], x[16:])


@pytest.mark.parametrize("block", [8, 256])  # 256: the native kernel's vector loop
@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize("spec", ["int8", "int4", "fp8"])
def test_a_non_finite_block_decodes_to_one_nan_and_encodes_again_to_its_payload(spec, impl, block):
    """What ``ring-hop`` needs to leave every rank with the same bits: an Inf block once
    decoded to 0 * Inf, x86's negative NaN, and encoded again to another payload."""
    codec = cp.get_codec(f"{spec}:impl={impl},block={block}")
    x = torch.ones(4 * block)
    x[1], x[block + 1], x[2 * block + 1] = float("inf"), -float("inf"), -float("nan")
    payload = codec.encode(x)
    decoded = codec.decode(payload, x.numel(), torch.float32)
    canonical = torch.tensor(float("nan")).view(torch.int32)
    assert (decoded[: 3 * block].view(torch.int32) == canonical).all()
    assert torch.equal(codec.encode(decoded), payload)
    assert torch.equal(decoded[3 * block :], x[3 * block :])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spec", ["int8", "int4", "fp8", "zfp:rate=16"])
def test_a_non_finite_block_decodes_to_a_16_bit_type_as_torch_casts_the_canonical_nan(spec, dtype):
    """docs/codecs.md: the NaN of a 16-bit collective's output is torch's cast of 0x7fc00000 (bf16:
    0xffff, not 0x7fc0, on a vectorised CPU), and its block, decoded so and encoded again
    (``ring-hop``, which refuses codecs that are not idempotent), gives the same payload."""
    codec = cp.get_codec(spec)
    for numel in (1, 7, 300):
        x = torch.ones(numel, dtype=dtype)
        x[numel // 2] = float("inf")
        payload = codec.encode(x)
        decoded = codec.decode(payload, numel, dtype)
        cast = torch.full((numel,), float("nan")).to(dtype).view(torch.int16)
        nans = decoded.isnan()
        assert nans[numel // 2] and (decoded.view(torch.int16)[nans] == cast[nans]).all()
        assert not codec.idempotent or torch.equal(codec.encode(decoded), payload)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "spec, keeps_sign",
    [("none", True), ("bf16", True), ("fp16", True), ("int8", False), ("int4", False),
     ("fp8", False), ("zfp:rate=16", False)],
)  # fmt: skip
def test_negative_zero_keeps_its_sign_only_through_none_and_the_casts(spec, keeps_sign, dtype):
    codec = cp.get_codec(spec)
    x = torch.full((300,), -0.0, dtype=dtype)
    decoded = codec.decode(codec.encode(x), x.numel(), dtype)
    assert (decoded == 0).all()
    assert torch.signbit(decoded).all() if keeps_sign else not torch.signbit(decoded).any()


def test_bf16_on_fp16_keeps_finite_values_finite():
    """65504 and 65408 round to bf16's 65536, which is Inf in fp16; the decode into fp16
    is still the fp32 decode cast, as for every codec."""
    codec = cp.get_codec("bf16")
    x = torch.tensor([65504, 65408, 65407, -65504, float("inf"), -float("inf")])
    x = x.to(torch.float16)
    payload = codec.encode(x)
    for out in (None, torch.empty(6, dtype=torch.float16)):
        decoded = codec.decode(payload, 6, torch.float16, out=out)
        assert torch.isfinite(decoded[:4]).all() and torch.equal(decoded[4:], x[4:])
        error = (decoded[:4].float() - x[:4].float()).abs()
        assert (error <= codec.error_bound(x)[:4]).all()
        assert torch.equal(decoded, codec.decode(payload, 6, torch.float32).half())
    fp32 = torch.tensor([1e6, -3e5])  # beyond fp16: Inf, as a cast gives
    assert torch.isinf(codec.decode(codec.encode(fp32), 2, torch.float16)).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_on_fp16_keeps_finite_values_finite_on_cuda():
    """The saturation above mixes a CPU scalar (the largest bf16 within fp16) into the CUDA
    tensor's arithmetic: the CPU's payload, bit for bit."""
    codec = cp.get_codec("bf16")
    x = torch.tensor([65504, 65408, 65407, -65504, float("inf"), -float("inf"), 1.5])
    x = x.to(torch.float16)
    payload = codec.encode(x.cuda())
    assert payload.is_cuda and torch.equal(payload.cpu(), codec.encode(x))


@pytest.mark.parametrize(
    "dtype, rate",  # bf16 from rate 16 on: every decode within reach casts to the largest
    [(torch.float16, 4), (torch.float16, 8), (torch.float16, 16), (torch.bfloat16, 4),
     (torch.bfloat16, 8)],
)  # fmt: skip
def test_zfp_keeps_16_bit_data_near_its_largest_finite(dtype, rate):
    """The fp32 decode of data near a 16-bit type's largest can land past it, and the cast
    made those values Inf (415 of 51,200 fp16 values at the default rate, in a hunt)."""
    codec = cp.get_codec(f"zfp:rate={rate}")
    largest = torch.finfo(dtype).max
    generator = torch.Generator().manual_seed(0)
    x = (largest * (1 - torch.rand(51_200, generator=generator) / 64)).to(dtype)
    x[1::2] *= -1
    decoded = codec.decode(codec.encode(x), x.numel(), dtype)
    assert torch.isfinite(decoded).all()
    assert ((decoded.float() - x.float()).abs() <= codec.error_bound(x)).all()


def test_zfp_keeps_values_near_the_largest_float_finite():
    """zfp's decode can land just past the input's absmax: past fp32's largest, Inf."""
    codec = cp.get_codec("zfp")
    x = torch.tensor([3.4028e38, 1.0, -2.0, 3.0])
    decoded = codec.decode(codec.encode(x), 4, torch.float32)
    assert torch.isfinite(decoded).all()
    assert ((decoded - x).abs() <= codec.error_bound(x)).all()


@pytest.mark.parametrize("spec", ["none", *LOSSY])
@pytest.mark.parametrize("offset", [0, 3, 4])
@pytest.mark.parametrize("numel", [512, 517])
def test_encode_into_a_slice_of_a_send_buffer(spec, offset, numel):
    """Whole blocks at an aligned offset take the native path by address (no views):
    its writes must stay inside ``out`` as the other paths' do (the default, native
    kernels here; the reference path cross-checks the bytes)."""
    codec = cp.get_codec(spec)
    x = torch.randn(numel)
    size = codec.wire_bytes(x.numel(), x.dtype)
    buffer = torch.zeros(size + offset + 5, dtype=torch.uint8)
    result = codec.encode(x, out=buffer[offset : offset + size])
    assert result.data_ptr() == buffer.data_ptr() + offset
    assert torch.equal(buffer[offset : offset + size], make(spec).encode(x))
    assert not buffer[:offset].any() and not buffer[offset + size :].any()


@pytest.mark.parametrize("spec", ["none", *LOSSY])
@pytest.mark.parametrize("offset", [0, 3, 4])
@pytest.mark.parametrize("numel", [512, 517])
def test_decode_from_and_into_slices(spec, offset, numel):
    codec = cp.get_codec(spec)  # native kernels; by address at offsets 0 and 4 of 512
    x = torch.randn(numel)
    payload = make(spec).encode(x)
    sent = torch.zeros(payload.numel() + offset + 5, dtype=torch.uint8)
    sent[offset : offset + payload.numel()] = payload
    output = torch.full((numel + 16,), 7.0)
    result = codec.decode(sent[offset : offset + payload.numel()], numel, x.dtype, out=output[8:-8])
    assert result.data_ptr() == output[8:].data_ptr()
    assert_same_bits(output[8:-8], make(spec).decode(payload, numel, x.dtype))
    assert (output[:8] == 7).all() and (output[-8:] == 7).all()


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_encode_out_of_the_wrong_size_is_refused(spec):
    codec = make(spec)
    with pytest.raises(ValueError, match=r"out must be a 1-D torch.uint8 tensor of \d+ bytes"):
        codec.encode(torch.randn(100), out=torch.empty(7, dtype=torch.uint8))


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_encode_out_on_another_device_is_refused(spec):
    codec = make(spec)
    x = torch.randn(300)
    elsewhere = torch.empty(codec.wire_bytes(300, x.dtype), dtype=torch.uint8, device="meta")
    with pytest.raises(ValueError, match="on cpu, like x"):
        codec.encode(x, out=elsewhere)


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_an_error_bound_of_a_non_tensor_is_refused_by_name(spec):
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        make(spec).error_bound([1.0, 2.0])


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_an_out_that_is_not_a_tensor_is_refused_by_name(spec):
    codec = make(spec)
    x = torch.randn(100)
    with pytest.raises(TypeError, match="out must be a torch.Tensor, got list"):
        codec.encode(x, out=[0] * codec.wire_bytes(100, torch.float32))
    with pytest.raises(TypeError, match="out must be a torch.Tensor, got list"):
        codec.decode(codec.encode(x), 100, torch.float32, out=[0.0] * 100)


@pytest.mark.parametrize(
    "spec", ["none", *LOSSY, "int8:impl=fused", "int4:impl=fused", "fp8:impl=fused"]
)
def test_an_out_overwritten_after_autograd_saved_it_fails_backward(spec):
    """The native kernels write by address; without the version bump that torch's in-place
    ops make, backward used the decoded values instead of the saved ones: a wrong gradient."""
    codec = make(spec)
    weight, saved = torch.ones(256, requires_grad=True), torch.full((256,), 2.0)
    loss = (weight * saved).sum()  # saves ``saved`` for the gradient of ``weight``
    payload = codec.encode(torch.full((256,), 5.0))
    codec.decode(payload, 256, torch.float32, out=saved)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    version = payload._version
    codec.encode(torch.randn(256), out=payload)
    assert payload._version > version


@pytest.mark.parametrize(
    "spec", ["none", *LOSSY, "int8:impl=fused", "int4:impl=fused", "fp8:impl=fused"]
)
@pytest.mark.parametrize("numel", [256, 300])
def test_an_out_that_requires_grad_is_written_as_torch_copies_into_it(spec, numel):
    """The native kernels wrote an fp32 ``out`` by address: a leaf that requires grad was
    overwritten where torch refuses the in-place write, and an ``out`` with a history kept
    it (``w * 3`` decoded into still gave ``w`` a gradient of 3, not the 0 of a copy)."""
    codec = make(spec)
    payload = codec.encode(torch.randn(numel))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        codec.decode(payload, numel, torch.float32, out=torch.zeros(numel, requires_grad=True))
    weight = torch.ones(numel, requires_grad=True)
    out = weight * 3
    codec.decode(payload, numel, torch.float32, out=out)
    assert torch.equal(out.detach(), codec.decode(payload, numel, torch.float32))
    out.sum().backward()
    assert torch.equal(weight.grad, torch.zeros(numel))


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_inputs_that_require_grad_are_encoded_outside_autograd(spec):
    codec = make(spec)
    x = torch.randn(300, requires_grad=True)
    payload = codec.encode(x)
    assert not payload.requires_grad
    assert torch.equal(payload, codec.encode(x.detach()))


@pytest.mark.parametrize("spec", ["none", *LOSSY])
@pytest.mark.parametrize("numel", [512, 517])
def test_a_strided_input_encodes_as_its_contiguous_copy(spec, numel):
    """With the default (native) kernels: a 1-D view with a stride of 2 reached the C
    encoder as its data pointer, which read the wrong elements (an assertion stopped it;
    under ``python -O`` nothing would have)."""
    codec = cp.get_codec(spec)
    x = torch.randn(2 * numel)[::2]
    assert not x.is_contiguous()
    assert torch.equal(codec.encode(x), codec.encode(x.contiguous()))


@pytest.mark.parametrize("spec", ["none", *LOSSY])
def test_a_strided_payload_is_refused_by_name(spec):
    codec = cp.get_codec(spec)
    payload = codec.encode(torch.randn(512))
    column = torch.zeros(payload.numel(), 2, dtype=torch.uint8)
    column[:, 0] = payload
    with pytest.raises(ValueError, match="payload must be contiguous"):
        codec.decode(column[:, 0], 512, torch.float32)


@pytest.mark.parametrize("spec", ["int8", "int4", "fp8", "int8:stochastic=true,seed=3"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_a_float64_default_dtype_changes_no_bit(spec, dtype):
    """The native kernels read and write fp32: their staging buffers and the rounding
    noise name it, not the process's default dtype (``torch.set_default_dtype(
    torch.float64)`` made them float64, which a kernel then read as fp32)."""
    for numel in (512, 517):
        x = torch.randn(numel, generator=torch.Generator().manual_seed(numel)).to(dtype)
        codec = dataclasses.replace(cp.get_codec(spec))  # a noise stream from its seed
        payload = codec.encode(x)
        decoded = codec.decode(payload, numel, dtype)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            again = dataclasses.replace(codec)
            assert torch.equal(again.encode(x), payload), numel
            assert_same_bits(again.decode(payload, numel, dtype), decoded, context=numel)
        finally:
            torch.set_default_dtype(previous)


def test_bf16_rounds_fp32_subnormals_to_its_own_spacing():
    """bf16's subnormals are 2**-133 apart, fp32's 2**-149: the error of an fp32 subnormal
    is not within |x| * 2**-8 (as docs/codecs.md's table said) but within half that spacing."""
    codec = cp.get_codec("bf16")
    x = torch.tensor([1e-40, -3e-39, 2.0**-140])
    error = (codec.decode(codec.encode(x), 3, torch.float32) - x).abs()
    assert (error > x.abs() * 2.0**-8).all()
    assert (error <= x.abs() * 2.0**-8 + 2.0**-134).all()


ONE_AS_FP32 = [0, 0, 128, 63]  # the block's absmax, 1.0, little-endian


@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize(
    ("name", "codes"),
    [
        ("int8", [127, 256 - 32, 0, 256 - 127]),  # q = round(x * 127), two's complement
        ("int4", [15 | 6 << 4, 8 | 1 << 4]),  # q + 8 = 15, 6, 8, 1; element 2i low nibble
        ("fp8", [0x7E, 0xEE, 0x00, 0xFE]),  # e4m3 of x * 448: 448, -112, 0, -448
    ],
)
def test_payloads_are_laid_out_as_documented(name, codes, impl):
    """Scales first, then the codes, as the codecs' docstrings give them. A layout changed
    on both sides (int4's nibbles swapped in encode and decode) decodes to the same values,
    so no round trip shows it; a peer of another version would decode garbage."""
    codec = cp.get_codec(f"{name}:impl={impl},block=4")
    payload = codec.encode(torch.tensor([1.0, -0.25, 0.0, -1.0]))
    assert payload.tolist() == ONE_AS_FP32 + codes


@pytest.mark.parametrize("spaced", ["int8@ ring-hop", "int8 @ring-hop ", "int8@\tring-hop"])
def test_whitespace_around_a_specs_algorithm_is_read_as_around_its_name(spaced):
    """``"int8@ ring-hop"`` was refused as an unknown algorithm ' ring-hop', where the
    spaces around the codec's name and options are left out."""
    from commpress.integrations.spec import CollectiveSpec
    from commpress.schedules import algorithms
    from commpress.train.loop import Run

    spec = CollectiveSpec.parse(spaced, algorithms("all_gather"), "spec", gathers=True)
    assert (spec.algorithm, str(spec.codec)) == ("ring-hop", str(cp.get_codec("int8")))
    assert Run.parse("powersgd:rank=2 @ serial", "ddp").scheduler is False


def test_a_codecs_kept_spec_and_sizes_are_neither_pickled_nor_shared_by_a_copy():
    """The spec string and payload sizes a codec keeps travelled with it in pickles, and a
    shallow copy shared the original's dict of sizes (filled by the communication thread
    while the caller copied or pickled it: 'dictionary changed size during iteration')."""
    import copy
    import pickle

    codec = registry.get_codec("int8")
    codec.encode(torch.randn(1000))
    str(codec)  # kept once asked for (the test passed only after another had asked)
    assert "_wire_sizes" in vars(codec) and "_spec" in vars(codec)
    for other in (copy.copy(codec), pickle.loads(pickle.dumps(codec))):
        assert "_wire_sizes" not in vars(other) and "_spec" not in vars(other)
        assert other == codec and str(other) == "int8"
        assert other.wire_bytes(1000, torch.float32) == codec.wire_bytes(1000, torch.float32)


def test_the_errors_of_one_element_and_one_byte_are_in_the_singular():
    """'out must hold 1 elements', 'payload has 1 bytes'."""
    codec = make("none")
    payload = codec.encode(torch.randn(1))
    with pytest.raises(ValueError, match="out must hold 1 element of torch.float32"):
        codec.decode(payload, 1, torch.float32, out=torch.empty(2))
    with pytest.raises(ValueError, match="payload has 1 byte but"):
        codec.decode(payload[:1], 1, torch.float32)


@pytest.mark.parametrize("spec", ["powersgd:rank=4", "acpsgd", "powersgd:rank=4@ring"])
def test_a_low_rank_spec_given_for_a_collective_points_to_the_low_rank_hook(spec):
    """``cp.ddp.hook("powersgd:rank=4")`` (or ``cp.fsdp.compress(model,
    reduce_scatter="powersgd:rank=4")``) said "unknown codec 'powersgd'; known: [...]",
    nothing of ``cp.lowrank.ddp_hook``, which the README shows beside ``cp.ddp.hook``."""
    from commpress.collectives import ALL_REDUCE_ALGORITHMS
    from commpress.integrations.spec import CollectiveSpec

    with pytest.raises(ValueError, match=r"codec=.*low-rank.*cp\.lowrank\.ddp_hook"):
        CollectiveSpec.parse(spec, ALL_REDUCE_ALGORITHMS, "codec", gathers=True)


def test_a_codec_spec_ending_in_an_at_sign_names_no_empty_algorithm():
    """``get_codec("int8@")`` (``--codec int8@``) told the user to write "algorithm=''
    (on the command line --codec int8 --algorithm )", an empty algorithm."""
    from commpress.codecs import get_codec

    with pytest.raises(ValueError) as raised:
        get_codec("int8@")
    message = str(raised.value)
    assert "algorithm=''" not in message and "--algorithm )" not in message
    assert "'int8@' ends in '@'" in message and "codec='int8'" in message


def test_an_integration_takes_a_codec_object_as_the_collectives_do():
    """``cp.ddp.hook(codec)`` and ``cp.fsdp.compress(all_gather=codec)`` refused a codec
    object ("must be a spec string") that every collective takes."""
    from commpress.collectives import ALL_REDUCE_ALGORITHMS
    from commpress.integrations.spec import CollectiveSpec

    codec = cp.get_codec("int4:block=64")
    spec = CollectiveSpec.parse(codec, ALL_REDUCE_ALGORITHMS, "codec", gathers=True)
    assert spec.codec is codec and spec.algorithm == "ring" and spec.text == str(codec)
    with pytest.raises(TypeError, match="codec must be a spec string such as 'int8' or a codec"):
        CollectiveSpec.parse(4, ALL_REDUCE_ALGORITHMS, "codec", gathers=True)


@pytest.mark.parametrize("algorithm", [None, 3, b"ring"])
def test_an_algorithm_not_a_str_is_a_type_error(algorithm):
    """``algorithm=None`` was answered with ValueError "unknown algorithm None"."""
    from commpress.collectives import ALL_GATHER_ALGORITHMS
    from commpress.collectives.checks import check_algorithm

    with pytest.raises(TypeError, match="algorithm must be a str such as 'ring', got"):
        check_algorithm(algorithm, ALL_GATHER_ALGORITHMS, True, "all_gather_into_tensor")
