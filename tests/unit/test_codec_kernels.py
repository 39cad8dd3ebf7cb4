"""The fused (torch.compile) path: bit-identical to the reference, compiled once, safe fallback."""

from __future__ import annotations

import dataclasses
import io
import shutil
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import commpress as cp
from commpress.codecs import blockwise, kernels, native
from commpress.codecs.fp8 import decode_fp8
from commpress.codecs.int4 import decode_int4
from commpress.codecs.int8 import decode_int8
from commpress.testing import assert_same_bits
from commpress.testing.stream_requests import recorded_stream_requests

FUSED_SPECS = [
    "int8",
    "int8:stochastic=true,seed=1",
    "int8:block=64",
    "int4",
    "int4:stochastic=true,seed=2",
    "fp8",
]
SIZES = [1, 255, 256, 4097, 100_003]


def with_impl(spec: str, impl: str):
    """A fresh instance: stochastic codecs then start their noise streams from the seed."""
    return dataclasses.replace(cp.get_codec(spec + ("," if ":" in spec else ":") + f"impl={impl}"))


#: (impl, spec, dtype): every one but the compiled stochastic encodes of bf16/fp16 input
#: (they add their noise after the same cast to fp32 as the other specs, checked here at
#: bf16/fp16, and the stochastic graphs are checked at fp32): each of those four cases
#: took 5-7 s of C++ compilation on a cold cache, as CI has.
FAST_PATH_CASES = [
    pytest.param(impl, spec, dtype, id=f"{impl}-{spec}-{str(dtype).removeprefix('torch.')}")
    for impl in ("fused", "compiled")
    for spec in FUSED_SPECS
    for dtype in (torch.float32, torch.bfloat16, torch.float16)
    if impl == "fused" or dtype == torch.float32 or "stochastic" not in spec
]


@pytest.mark.slow
@pytest.mark.parametrize(("impl", "spec", "dtype"), FAST_PATH_CASES)
def test_fast_paths_equal_reference_bit_for_bit(impl, spec, dtype):
    fused, reference = with_impl(spec, impl), with_impl(spec, "reference")
    generator = torch.Generator().manual_seed(0)
    for numel in SIZES:
        x = (torch.randn(numel, generator=generator) * 10).to(dtype)
        if numel > 300:
            x[numel // 2] = float("nan")
        payload = fused.encode(x)
        assert torch.equal(payload, reference.encode(x)), (spec, numel)
        for out_dtype in (torch.float32, dtype):
            assert_same_bits(
                fused.decode(payload, numel, out_dtype),
                reference.decode(payload, numel, out_dtype),
                context=(spec, numel, out_dtype),
            )


@pytest.mark.parametrize("spec", ["int4:block=3072", "int4:block=3072,stochastic=true,seed=4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_blocks_longer_than_the_kernels_chunk_equal_the_reference(spec, dtype):
    """The C int4 encoder works through a block 1024 values at a time: each chunk must
    read its own noise and write its own codes (the sizes above keep to the default block)."""
    fused, reference = with_impl(spec, "fused"), with_impl(spec, "reference")
    x = (torch.randn(2 * 3072 + 100, generator=torch.Generator().manual_seed(6)) * 3).to(dtype)
    payload = fused.encode(x)
    assert torch.equal(payload, reference.encode(x))
    assert_same_bits(
        fused.decode(payload, x.numel(), torch.float32),
        reference.decode(payload, x.numel(), torch.float32),
    )


@pytest.mark.slow
def test_new_sizes_do_not_recompile():
    codec = cp.get_codec("int8")
    for numel in (1000, 3000):  # warm up: the first sizes may settle the dynamic shapes
        codec.decode(codec.encode(torch.randn(numel)), numel, torch.float32)
    before = counters["stats"]["unique_graphs"]
    for numel in (517, 4096, 12_345, 70_001, 1 << 20):
        codec.decode(codec.encode(torch.randn(numel)), numel, torch.float32)
    assert counters["stats"]["unique_graphs"] == before


def _doubled_into(x, out):  # a kernel of this test's own: no other test compiled it
    out.copy_(x.float() * 2)


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["twin-per-signature", "one-for-all"])
def test_each_signature_compiles_apart_and_a_recompile_limit_never_disables_them(
    monkeypatch, shared
):
    """Every dtype gets its own compiled graph even where dynamo allows one graph per code
    object: each signature compiles a twin with a code object of its own, and nothing warns.
    With one signature for all (broken on purpose) the second dtype hits the limit: the
    kernel warns and compiles a fresh twin, still compiled, never the reference path."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    monkeypatch.setattr(kernels, "_fused_available", True)
    monkeypatch.setattr(kernels, "_warned", set())
    if shared:
        monkeypatch.setattr(kernels, "signature", lambda args: ())
    doubled = kernels.Kernel(_doubled_into)
    before = counters["stats"]["unique_graphs"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = torch.randn(1000).to(dtype)
            out = torch.empty(1000)
            doubled(x, out)
            assert torch.equal(out, x.float() * 2)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    limit_hit = [m for m in messages if "needed more graphs" in m]
    assert counters["stats"]["unique_graphs"] - before == 3  # each dtype compiled
    assert (doubled.twins, len(limit_hit), len(messages)) == (3, 1 if shared else 0, len(limit_hit))
    assert kernels.fused_available()


@pytest.mark.slow
def test_a_recompile_limit_warning_made_an_error_reaches_the_caller_and_disables_nothing(
    monkeypatch,
):
    """Under ``-W error`` (and this suite's filter) the limit's warning is an exception: it
    reaches the caller as such, not mistaken for a failed compile that would turn the
    compiled kernels off for the whole process."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    monkeypatch.setattr(kernels, "_fused_available", True)
    monkeypatch.setattr(kernels, "_warned", set())
    monkeypatch.setattr(kernels, "signature", lambda args: ())
    doubled = kernels.Kernel(_doubled_into)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        doubled(torch.randn(1000), torch.empty(1000))
        with pytest.raises(RuntimeWarning, match="needed more graphs"):
            doubled(torch.randn(1000).to(torch.bfloat16), torch.empty(1000))
    assert kernels.fused_available()


def test_compile_failure_warns_once_and_falls_back(monkeypatch):
    def broken_compile(fn, **kwargs):
        def fail(*args):
            raise RuntimeError("no C++ compiler")

        return fail

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(kernels, "_fused_available", True)
    calls = []
    first = kernels.Kernel(lambda x: calls.append("first") or x + 1)
    second = kernels.Kernel(lambda x: calls.append("second") or x * 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert first(torch.tensor(1)).item() == 2
        assert first(torch.tensor(1)).item() == 2
        assert second(torch.tensor(3)).item() == 6
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1 and "no C++ compiler" in str(runtime[0].message)
    assert calls == ["first", "first", "second"]
    assert not kernels.fused_available()


@pytest.mark.parametrize("spec", ["int8", "int4", "fp8"])
def test_native_kernels_are_used_for_fp32_bf16_and_fp16_on_cpu(spec):
    codec = cp.get_codec(spec)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert codec._native(codec.native_encode, torch.zeros(1, dtype=dtype)) is not None
    assert codec._native(codec.native_encode, torch.zeros(1, dtype=torch.float64)) is None
    assert with_impl("int8", "compiled")._native("encode_int8", torch.zeros(1)) is None


def _fp8_grid_ties_and_neighbours() -> torch.Tensor:
    """Every finite e4m3 value, the midpoints between neighbours (ties go to the even
    code) and a hair either side of them, with both signs."""
    grid = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)]  # 0 .. 448, subnormals included
    ties = (grid[:-1] + grid[1:]) / 2
    hair = ties * 2.0**-20
    values = torch.cat([grid, ties, ties - hair, ties + hair])
    return torch.cat([values, -values])


def _in_blocks_led_by(values: torch.Tensor, lead: float, block: int) -> torch.Tensor:
    """``values`` in rows of ``block``, each row starting with ``lead`` (its absmax)."""
    rows = -(-values.numel() // (block - 1))
    padded = torch.zeros(rows * (block - 1))
    padded[: values.numel()] = values
    return torch.cat([torch.full((rows, 1), lead), padded.view(rows, block - 1)], 1)


def test_the_native_kernels_decline_an_odd_int4_block_and_fp8_noise_writing_nothing():
    """The codecs never ask for these (int4 refuses an odd block, fp8 draws no noise), but
    a kernel asked anyway must say no (-1) rather than write half a byte per row past its
    codes, or round fp8 stochastically in a way no other path does."""
    x, noise = torch.randn(2, 6), torch.rand(2, 6)
    scales, codes = torch.full((2,), 9.0), torch.full((12,), 0x5A, dtype=torch.uint8)
    out, odd_rows = torch.full((12,), 9.0), x.view(-1)[:10]
    assert native.kernel("encode_int4").status(odd_rows, None, 2, 5, 7.0, scales, codes) == -1
    assert native.kernel("decode_int4").status(scales, codes, 2, 5, 7.0, out, 0) == -1
    assert native.kernel("encode_fp8").status(x, noise, 2, 6, 448.0, scales, codes) == -1
    assert scales.eq(9.0).all() and codes.eq(0x5A).all() and out.eq(9.0).all()
    assert native.kernel("encode_fp8").status(x, None, 2, 6, 448.0, scales, codes) == 0


def test_a_native_kernel_refuses_a_strided_tensor_rather_than_read_past_it():
    payload = cp.get_codec("int8").encode(torch.randn(256))
    decode = native.kernel("decode_int8")
    every_other = torch.empty(512)[::2]
    with pytest.raises(ValueError, match="contiguous CPU tensors only"):
        decode(payload[:4].view(torch.float32), payload[4:], 1, 256, 127.0, every_other, 0)


def test_a_native_pointer_argument_is_a_tensor_an_address_or_none():
    """An address passes as ``native.Address`` only: a plain int where the C side takes a
    pointer is refused, not dereferenced."""
    x, out = torch.randn(256), torch.empty(256)
    payload = cp.get_codec("int8").encode(x)
    decode = native.kernel("decode_int8")
    start = payload.data_ptr()
    scales, codes = native.Address(start), native.Address(start + 4)
    assert decode(scales, codes, 1, 256, 127.0, out, 0)
    reference = cp.get_codec("int8:impl=reference").decode(payload, 256, torch.float32)
    assert_same_bits(out, reference)
    with pytest.raises(TypeError, match="argument 0 must be a tensor, an Address or None"):
        decode(start, codes, 1, 256, 127.0, out, 0)


def test_native_fp8_rounds_every_grid_point_and_tie_as_torch_casts():
    """The C rounding itself, against torch's cast to float8_e4m3fn: with an absmax and a
    qmax of 512 the kernel sees v = (x / 512) * 512 = x exactly, so every value above is
    rounded as it stands (the leading 512, outside e4m3's range, is not compared)."""
    blocks = _in_blocks_led_by(_fp8_grid_ties_and_neighbours(), 512.0, 256)
    rows = blocks.shape[0]
    scales, codes = torch.empty(rows), torch.empty(rows, 256, dtype=torch.uint8)
    assert native.kernel("encode_fp8")(blocks, None, rows, 256, 512.0, scales, codes)
    expected = blocks.to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(codes[:, 1:], expected[:, 1:])


def test_fp8_fused_and_reference_agree_around_every_grid_point_and_tie():
    """The whole codec, native against the reference, with absmax 448: most of these values
    reach the rounding as they are, the others a few ulps off."""
    x = _in_blocks_led_by(_fp8_grid_ties_and_neighbours(), 448.0, 256).reshape(-1)
    fused, reference = with_impl("fp8", "fused"), with_impl("fp8", "reference")
    assert fused._native(fused.native_encode, x) is not None
    payload = fused.encode(x)
    assert torch.equal(payload, reference.encode(x))
    assert_same_bits(
        fused.decode(payload, x.numel(), torch.float32),
        reference.decode(payload, x.numel(), torch.float32),
    )


#: fp32 elements just past what a native decode streams from (blockwise.STREAM_MIN_BYTES).
STREAMED = blockwise.STREAM_MIN_BYTES // 4 + 4096


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as info:
            return any(
                line.startswith("flags") and flag in line.split(":", 1)[1].split() for line in info
            )
    except OSError:
        return False


needs_avx512 = pytest.mark.skipif(not _cpu_has("avx512f"), reason="needs AVX-512")

#: The builds whose decodes stream: as the package builds them (AVX-512 here), and without
#: AVX-512 (the AVX2 loops, as CPUs without it run them).
STREAMING_BUILDS = [
    pytest.param((), marks=needs_avx512, id="avx512"),
    pytest.param(
        ("-mno-avx512f",),
        marks=pytest.mark.skipif(not _cpu_has("avx2"), reason="needs AVX2"),
        id="avx2",
    ),
]


def _decode_kernel(name: str, flags: tuple[str, ...], cache, monkeypatch):
    if not flags:
        return native.kernel(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return native.wrap(native.build(extra_flags=flags), name)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Every bit, NaN payloads and signs included (assert_same_bits lets any NaN match)."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.fixture
def stream_requests():
    with recorded_stream_requests() as asked:
        yield asked


@pytest.mark.parametrize("spec", ["int8", "int4", "fp8", "int4:block=6"])
def test_a_large_decode_asks_to_stream_and_has_the_reference_bits(spec, stream_requests):
    """Large fp32 output asks the kernel for non-temporal stores for its whole blocks
    (which it uses where a block holds whole vectors and the output starts on a cache
    line; else the plain loop: ``block=6``, an output off a line); 16-bit output never
    asks (it is rounded from an fp32 buffer read at once), nor small output. Each against
    the reference, with a NaN and an Inf among the values."""
    fused, reference = with_impl(spec, "fused"), with_impl(spec, "reference")
    x = torch.randn(STREAMED, generator=torch.Generator().manual_seed(0)) * 5
    x[1000], x[STREAMED // 2] = float("nan"), float("inf")
    payload, small = fused.encode(x), fused.encode(x[:1536])
    asked = stream_requests

    def flags(decoded, numel, dtype, out=None, streaming=True) -> list[int]:
        asked.clear()
        expected = reference.decode(decoded, numel, dtype)
        if streaming:
            with blockwise.streaming_decodes:
                assert_same_bits(fused.decode(decoded, numel, dtype, out=out), expected)
        else:
            assert_same_bits(fused.decode(decoded, numel, dtype, out=out), expected)
        return list(asked)

    aligned, off_a_line = torch.empty(STREAMED), torch.empty(STREAMED + 1)[1:]
    assert aligned.data_ptr() % 64 == 0 and off_a_line.data_ptr() % 64
    for out in (aligned, off_a_line):
        assert flags(payload, STREAMED, torch.float32, out)[0] == 1  # a tail's padded row: 0
    assert not any(flags(payload, STREAMED, torch.float32, aligned, streaming=False))
    assert not any(flags(payload, STREAMED, torch.bfloat16))
    assert not any(flags(small, 1536, torch.float32))
    assert not blockwise.streaming_decodes.on


def test_only_large_fp32_output_asks_to_stream_and_only_where_allowed():
    below = blockwise.STREAM_MIN_BYTES // 4 - 1
    with blockwise.streaming_decodes:
        assert not blockwise.streams(torch.empty(below))
        assert blockwise.streams(torch.empty(below + 1))
        assert not blockwise.streams(torch.empty(STREAMED, dtype=torch.bfloat16))
    assert not blockwise.streams(torch.empty(below + 1))


@pytest.mark.parametrize("algorithm", ["ring", "ring-hop"])
def test_an_all_gather_streams_its_output_and_a_reduce_scatter_reads_its_decodes(
    algorithm, stream_requests
):
    """An all-gather's decodes into an output left to its caller ask for non-temporal
    stores (in a world of one too); into an output read back at once (an all-reduce's
    gather), or a reduce-scatter's, which it adds to at once, they do not (the payloads of
    one rank of two)."""
    from commpress.collectives import payloads
    from commpress.schedules.registry import plan

    asked = stream_requests
    codec = with_impl("int8", "fused")
    shard = torch.randn(STREAMED)
    for world, left_to_the_caller in ((2, True), (1, True), (2, False)):
        (gather,) = plan("all_gather", algorithm, 0, world, STREAMED, torch.float32, codec)
        out = torch.empty(world * STREAMED)
        gathered = payloads.Gathered(out, shard, codec, gather, left_to_the_caller)
        for step in gather.steps:
            gathered.encode_own(step.sends[0])
        asked.clear()
        gathered.begin()  # the own shard's decode into the output
        assert asked == [int(left_to_the_caller)], (world, left_to_the_caller)
    asked.clear()
    contributions = torch.randn(2, STREAMED)
    (scatter,) = plan("reduce_scatter", algorithm, 0, 2, 2 * STREAMED, torch.float32, codec)
    partial_sums = payloads.reduction(contributions, codec, scatter)
    for step in scatter.steps:
        for receive in step.receives:
            partial_sums.handle(receive)
    assert asked and not any(asked)


def test_the_permission_to_stream_nests_and_ends_with_its_outermost_block():
    with blockwise.streaming_decodes:
        with blockwise.streaming_decodes:
            pass
        assert blockwise.streaming_decodes.on
        with pytest.raises(RuntimeError), blockwise.streaming_decodes:
            raise RuntimeError
        assert blockwise.streaming_decodes.on
    assert not blockwise.streaming_decodes.on


DECODES = [("decode_int8", 127.0, 1.0), ("decode_int4", 7.0, 0.5), ("decode_fp8", 448.0, 1.0)]


def _rows_of_every_code(code_bytes: float, rows: int = 64, block: int = 256):
    """``rows`` blocks of codes cycling through every byte (each int4 nibble, each fp8 code,
    NaN codes included), and their scales."""
    codes = torch.arange(rows * int(block * code_bytes)).remainder(256).to(torch.uint8)
    return torch.rand(rows, generator=torch.Generator().manual_seed(1)) * 3, codes


@pytest.mark.parametrize("flags", STREAMING_BUILDS)
@pytest.mark.parametrize(("name", "qmax", "code_bytes"), DECODES)
def test_the_streamed_and_the_plain_native_decodes_write_the_same_bits(
    name, qmax, code_bytes, flags, tmp_path, monkeypatch
):
    """Both stores of the C kernel, the streamed one taken (the kernel says so)."""
    rows, block = 64, 256
    scales, codes = _rows_of_every_code(code_bytes, rows, block)
    decode = _decode_kernel(name, flags, tmp_path, monkeypatch)
    plain, streamed = torch.full((rows * block,), 7.0), torch.full((rows * block,), 7.0)
    assert decode.status(scales, codes, rows, block, qmax, plain, 0) == 0
    assert decode.status(scales, codes, rows, block, qmax, streamed, 1) == 1
    assert _same_bits(streamed, plain)
    assert not (plain == 7.0).any()


REFERENCE_DECODES = {
    "decode_int8": decode_int8,
    "decode_int4": decode_int4,
    "decode_fp8": decode_fp8,
}


@pytest.mark.parametrize("stream", [0, 1])
@pytest.mark.parametrize("flags", STREAMING_BUILDS)
@pytest.mark.parametrize(("name", "qmax", "code_bytes"), DECODES)
def test_native_decodes_of_every_code_have_the_reference_bits(
    name, qmax, code_bytes, flags, stream, tmp_path, monkeypatch
):
    """The fp8 NaN codes (S.1111.111) decoded to 0x7fc00000 with their sign in C and in
    the compiled path, but to 0x7ff00000 in the reference (eager torch's widening)."""
    rows, block = 64, 256
    scales, codes = _rows_of_every_code(code_bytes, rows, block)
    decode = _decode_kernel(name, flags, tmp_path, monkeypatch)
    native_out, reference_out = torch.empty(rows * block), torch.empty(rows * block)
    assert decode.status(scales, codes, rows, block, qmax, native_out, stream) == stream
    REFERENCE_DECODES[name].reference(scales.view(-1, 1), codes.view(rows, -1), reference_out)
    assert _same_bits(native_out, reference_out)


def test_every_fp8_code_decodes_to_the_same_bits_on_every_path():
    paths = {impl: with_impl("fp8", impl) for impl in ("fused", "compiled", "reference")}
    payload = paths["reference"].encode(torch.ones(1024))
    payload[16:] = torch.arange(1024).remainder(256).to(torch.uint8)
    decoded = {impl: codec.decode(payload, 1024, torch.float32) for impl, codec in paths.items()}
    for impl in ("fused", "compiled"):
        assert _same_bits(decoded[impl], decoded["reference"]), impl


@pytest.mark.parametrize("flags", STREAMING_BUILDS)
def test_the_kernel_streams_only_whole_lines_on_a_cache_line(flags, tmp_path, monkeypatch):
    scales, codes = _rows_of_every_code(1.0, rows=4, block=256)
    decode = _decode_kernel("decode_int8", flags, tmp_path, monkeypatch)
    out = torch.empty(4 * 256 + 16)
    assert decode.status(scales, codes, 4, 256, 127.0, out[:1024], 1) == 1
    assert decode.status(scales, codes, 4, 256, 127.0, out[1:1025], 1) == 0
    assert decode.status(scales, codes[:1000], 4, 250, 127.0, out[:1000], 1) == 0
    assert decode.status(scales, codes, 4, 256, 127.0, out[:1024], 0) == 0


@pytest.mark.parametrize("spec", ["int8", "int4", "int8:stochastic=true", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_input_on_cpu_never_waits_for_torch_compile(spec, dtype, monkeypatch):
    """The first bf16 step of an FSDP2 user must not stall on compilation (5.5 s measured)."""

    def refuse(self, *args, fused=True):
        if fused:
            raise AssertionError(f"{self.__name__} went through torch.compile")
        return self.reference(*args)

    monkeypatch.setattr(kernels.Kernel, "__call__", refuse)
    fused, reference = with_impl(spec, "fused"), with_impl(spec, "reference")
    numel = 3 * blockwise.WIDEN_ELEMENTS + 1000  # several widening slices and a tail block
    x = (torch.randn(numel, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    x[blockwise.WIDEN_ELEMENTS + 5] = float("nan")  # in the second slice
    payload = fused.encode(x)
    assert torch.equal(payload, reference.encode(x))
    for out_dtype in (dtype, torch.float32):
        assert_same_bits(
            fused.decode(payload, numel, out_dtype), reference.decode(payload, numel, out_dtype)
        )


@pytest.mark.parametrize("spec", ["int8", "int4", "int8:stochastic=true", "int4:block=6", "fp8"])
def test_portable_native_build_equals_reference(spec, monkeypatch, tmp_path):
    """The kernels without AVX-512 (what other CPUs run) are bit-identical too."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    portable = native.build(extra_flags=("-mno-avx512f",))
    monkeypatch.setattr(native, "kernel", lambda name: native.wrap(portable, name))
    fused, reference = with_impl(spec, "fused"), with_impl(spec, "reference")
    for numel in (1, 300, 4097, 100_003):
        x = torch.randn(numel) * 3
        if numel > 1000:
            x[numel // 2] = float("nan")
        payload = fused.encode(x)
        assert torch.equal(payload, reference.encode(x)), (spec, numel)
        assert_same_bits(
            fused.decode(payload, numel, torch.float32),
            reference.decode(payload, numel, torch.float32),
            context=(spec, numel),
        )


def test_native_build_failure_warns_once_and_uses_compiled_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_libraries", {})
    monkeypatch.setattr(kernels, "_warned", set())
    codec, reference = cp.get_codec("int8"), with_impl("int8", "reference")
    x = torch.randn(1000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        payload = codec.encode(x)
        codec.encode(x)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "native blockquant unavailable" in messages[0]
    assert torch.equal(payload, reference.encode(x))


def test_a_native_build_failure_fails_the_suite(monkeypatch, tmp_path):
    """pyproject's filterwarnings make a fallback from the C kernels an error in the tests;
    its pattern named a message that commit 1934125 renamed, so the fallback passed."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_libraries", {})
    monkeypatch.setattr(kernels, "_warned", set())
    with pytest.raises(RuntimeWarning, match="native blockquant unavailable"):
        cp.get_codec("int8").encode(torch.randn(1000))


#: Measured on an H200 (``benchmarks/gpu_2026-11-27/README.md``, 16 Mi elements): CUDA's
#: encode gave 12 (int8), 8 (fp8) and 0 (int4) bytes other than the CPU's, and its decode
#: of the same payload differed from the CPU's by up to 2 units in the last place (CUDA
#: rounds the divisions differently: the first GPU session's bit-exact check passed by
#: chance on fresh random inputs). Within a device every rank runs the same kernels, so
#: ranks still agree bit for bit; across devices the bound below holds.
CUDA_CODES_DIFFERING_AT_MOST = 1e-4  # of the payload's bytes (measured: under 1e-6)
CUDA_DECODE_ULPS_AT_MOST = 4  # measured: 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("spec", ["none", "bf16", "fp16", *FUSED_SPECS])
def test_cuda_matches_cpu_reference(spec):
    codec = cp.get_codec(spec)
    seed = int(torch.randint(0, 2**31, ()))  # fresh inputs each run, reproducible from the seed
    x = torch.randn(100_003, generator=torch.Generator().manual_seed(seed)) * 10
    payload = codec.encode(x.cuda())
    assert payload.is_cuda and payload.numel() == codec.wire_bytes(x.numel(), x.dtype)
    decoded = codec.decode(payload, x.numel(), torch.float32)
    assert decoded.is_cuda
    assert torch.all((decoded.cpu() - x).abs() <= codec.error_bound(x))
    on_cpu = codec.encode(x)
    if codec.lossless:
        assert torch.equal(payload.cpu(), on_cpu)
    elif "stochastic" not in spec:
        differing = (payload.cpu() != on_cpu).float().mean()
        assert differing <= CUDA_CODES_DIFFERING_AT_MOST, (seed, float(differing))
    decoded_from_cpu = codec.decode(on_cpu.cuda(), x.numel(), torch.float32).cpu()
    reference = codec.decode(on_cpu, x.numel(), torch.float32)
    ulps = (decoded_from_cpu.view(torch.int32).long() - reference.view(torch.int32).long()).abs()
    assert int(ulps.max()) <= (0 if codec.lossless else CUDA_DECODE_ULPS_AT_MOST), seed


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_cxx_compiler_named_as_cc_builds_the_kernels_as_c(monkeypatch, tmp_path):
    """g++ compiled blockquant.c as C++: names mangled, every encode an AttributeError."""
    monkeypatch.setenv("CC", shutil.which("g++"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    encode = native.wrap(native.build(), "encode_int8")
    x, scales, codes = torch.tensor([1.0, -0.5]), torch.empty(1), torch.empty(2, dtype=torch.int8)
    assert encode(x, None, 1, 2, 127.0, scales, codes)
    assert codes.tolist() == [127, -64] and scales.tolist() == [1.0]


def test_cc_may_be_a_command_with_arguments(monkeypatch, tmp_path):
    """CC="ccache gcc" or "gcc -w", as make takes it, was run as one program name: no such
    file, and the codecs fell back to torch.compile."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    monkeypatch.setenv("CC", f"{compiler} -DCOMMPRESS_UNUSED=1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert native.wrap(native.build(), "decode_int8") is not None


def test_another_cc_gets_a_build_of_its_own(monkeypatch, tmp_path):
    """The cache key left CC out: CC="gcc -mno-avx512f" loaded the build of plain gcc
    already cached (AVX-512 kernels), and a CC that no longer exists still "built"."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", compiler)
    plain = native.build()._name
    monkeypatch.setenv("CC", f"{compiler} -DCOMMPRESS_UNUSED=1")
    assert native.build()._name != plain
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(FileNotFoundError, match="no-such-compiler"):
        native.build()


def test_a_cc_with_an_unclosed_quote_fails_the_build_as_any_other(monkeypatch):
    """shlex's ValueError escaped the build's fallback: every int8/int4/fp8 encode raised
    it, naming no CC, instead of warning and taking the compiled path."""
    monkeypatch.setenv("CC", 'gcc "-w')
    with pytest.raises(RuntimeError, match="CC='gcc \"-w' cannot be read as a command"):
        native._compiler_command()


ARM_CPUINFO = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd {}\nCPU part\t: {}\n"


def test_arm_processors_of_other_features_get_builds_of_their_own(monkeypatch):
    """Only x86's "flags" line keyed the cache: every ARM processor had the same key, so a
    -march=native build of one (with SVE, say) was loaded on another that lacks it."""

    def identity(cpuinfo: str) -> str:
        monkeypatch.setattr(native, "open", lambda *_: io.StringIO(cpuinfo), raising=False)
        return native._cpu_identity()

    neoverse_v2 = identity(ARM_CPUINFO.format("sve sve2", "0xd4f"))
    neoverse_n1 = identity(ARM_CPUINFO.format("atomics", "0xd0c"))
    assert neoverse_v2 != neoverse_n1
    assert identity("flags\t\t: fpu sse2 avx2\n") != identity("flags\t\t: fpu sse2 avx512f\n")


def test_another_processor_gets_a_build_of_its_own(monkeypatch, tmp_path):
    """The cache key holds the processor's identity (a -march=native build is never loaded
    on a processor without its features), not only the source and the command."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    here = native.build()._name
    monkeypatch.setattr(native, "_cpu_identity", lambda: "x86_64\nflags\t\t: fpu sse2")
    assert native.build()._name != here
    assert len(list((tmp_path / "commpress").glob("blockquant-*.so"))) == 2
