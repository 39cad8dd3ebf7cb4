/*
 * Native CPU kernels for block-wise absmax quantization (int8, int4, fp8).
 *
 * They compute exactly what the plain-torch reference in blockwise.py computes,
 * bit for bit, so they must be built without value-changing optimizations:
 * -ffp-contract=off (no FMA fusion), and never -ffast-math.
 *
 *   absmax = max |x| over the block (NaN if the block holds a NaN or an Inf)
 *   v      = (x / absmax) * qmax           when 0 < absmax < inf, else 0
 *   q      = nearbyint(v)                  or clamp(floor(v) + (frac(v) + noise >= 1), +-qmax)
 *   x_hat  = (q / qmax) * absmax
 *
 * int8 codes are the two's-complement bytes of q; int4 codes are the nibbles
 * q + 8, element 2i in the low nibble of byte i. fp8 codes are v rounded to
 * float8 e4m3fn (ties to even), as torch's cast to torch.float8_e4m3fn does.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* How far ahead of the block being read its input is fetched into the cache (a prefetch
 * is a hint: past the end of the input it reads nothing), by the AVX-512 and the AVX2
 * loops. From memory not in the caches, an int8 encode of 1M values takes about 0.4 ms
 * with it against 0.6 ms without (benchmarks/streaming_2026-12-06/kernels*.txt). */
#define PREFETCH_BYTES 2048

/* |x| compared as integers: for non-NaN floats, the order of (bits & 0x7fffffff)
 * is the order of |x|, and an integer max needs no fast-math to vectorize. */
static float block_absmax(const float *x, int64_t n) {
    uint32_t largest = 0;
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    __m512i lanes = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16) {
        _mm_prefetch((const char *)((uintptr_t)(x + i) + PREFETCH_BYTES), _MM_HINT_T0);
        lanes = _mm512_max_epu32(lanes, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
    }
    largest = _mm512_reduce_max_epu32(lanes);
#elif defined(__AVX2__)
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
    __m256i lanes = _mm256_setzero_si256();
    for (; i + 8 <= n; i += 8) {
        _mm_prefetch((const char *)((uintptr_t)(x + i) + PREFETCH_BYTES), _MM_HINT_T0);
        lanes = _mm256_max_epu32(
            lanes, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), magnitude));
    }
    uint32_t each[8];
    _mm256_storeu_si256((__m256i *)each, lanes);
    for (int k = 0; k < 8; k++) largest = each[k] > largest ? each[k] : largest;
#endif
    for (; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        bits &= 0x7fffffffu;
        largest = bits > largest ? bits : largest;
    }
    if (largest >= 0x7f800000u) return NAN; /* the canonical NaN: Inf decodes as NaN does */
    float absmax;
    memcpy(&absmax, &largest, sizeof absmax);
    return absmax;
}

static int usable(float absmax) { return absmax > 0.0f && isfinite(absmax); }

static inline float nearest(float x, float absmax, float qmax) {
    return nearbyintf((x / absmax) * qmax);
}

/* floor(v) + 1 where frac(v) + u >= 1, clamped to [-qmax, qmax], as
 * blockwise.round_to_integers (not floor(v + u), which v + u rounded up in float turns
 * into the next integer). */
static inline float stochastic(float x, float absmax, float qmax, float u) {
    const float v = (x / absmax) * qmax, down = floorf(v);
    const float r = (v - down) + u >= 1.0f ? down + 1.0f : down;
    return r < -qmax ? -qmax : (r > qmax ? qmax : r);
}

/* q[i] = nearest((x[i] / absmax) * qmax) as int8. The AVX-512 loop does what gcc's
 * auto-vectorized one does (cvtps rounds to nearest even, as nearbyintf does in the
 * default rounding mode) with a shorter int32 -> int8 narrowing: about 15% faster. */
static void nearest_codes(const float *x, int64_t n, float absmax, float qmax, int8_t *q) {
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512 scale = _mm512_set1_ps(absmax), top = _mm512_set1_ps(qmax);
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_div_ps(_mm512_loadu_ps(x + i), scale), top);
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
#endif
    for (; i < n; i++) q[i] = (int8_t)(int32_t)nearest(x[i], absmax, qmax);
}

/* Codes are stored straight from registers: no staging buffer, so any block size works. */
int commpress_encode_int8(const float *x, const float *noise, int64_t rows, int64_t block,
                          float qmax, float *scales, int8_t *codes) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * block;
        int8_t *out = codes + r * block;
        const float a = scales[r] = block_absmax(xr, block);
        if (!usable(a)) {
            memset(out, 0, (size_t)block);
        } else if (noise == NULL) {
            nearest_codes(xr, block, a, qmax, out);
        } else {
            const float *u = noise + r * block;
            for (int64_t i = 0; i < block; i++)
                out[i] = (int8_t)(int32_t)stochastic(xr[i], a, qmax, u[i]);
        }
    }
    return 0;
}

/* int4 goes through int8 codes in an L1-sized chunk: both loops then vectorize,
 * unlike a loop over pairs of floats. */
#define INT4_CHUNK 1024

int commpress_encode_int4(const float *x, const float *noise, int64_t rows, int64_t block,
                          float qmax, float *scales, uint8_t *codes) {
    if (block % 2) return -1;
    int8_t q[INT4_CHUNK];
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * block;
        uint8_t *out = codes + r * (block / 2);
        const float a = scales[r] = block_absmax(xr, block);
        for (int64_t start = 0; start < block; start += INT4_CHUNK) {
            const int64_t n = block - start < INT4_CHUNK ? block - start : INT4_CHUNK;
            const float *xc = xr + start;
            if (!usable(a)) {
                memset(q, 0, (size_t)n);
            } else if (noise == NULL) {
                nearest_codes(xc, n, a, qmax, q);
            } else {
                const float *u = noise + r * block + start;
                for (int64_t i = 0; i < n; i++)
                    q[i] = (int8_t)(int32_t)stochastic(xc[i], a, qmax, u[i]);
            }
            uint8_t *oc = out + start / 2;
            for (int64_t i = 0; i < n / 2; i++)
                oc[i] = (uint8_t)((q[2 * i] + 8) | ((q[2 * i + 1] + 8) << 4));
        }
    }
    return 0;
}

/* The streamed decode: each ISA's vector of floats (`lanes`, LANES of them), the codes of
 * elements i to i + LANES - 1 of a row (i a multiple of LANES) as floats, and a store that
 * writes a vector past the caches. */
#ifdef __AVX512F__
#define LANES 16
typedef __m512 lanes;
static inline lanes splat(float x) { return _mm512_set1_ps(x); }
static inline lanes dequantized(lanes q, lanes qmax, lanes absmax) {
    return _mm512_mul_ps(_mm512_div_ps(q, qmax), absmax);
}
static inline void store_past_caches(float *out, lanes x) { _mm512_stream_ps(out, x); }

static inline lanes int8_codes(const uint8_t *c, int64_t i) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c + i))));
}

static inline lanes int4_codes(const uint8_t *c, int64_t i) {
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)(c + i / 2));
    const __m128i nibble = _mm_set1_epi8(0xf);
    const __m128i low = _mm_and_si128(bytes, nibble);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(low, high)); /* element 2i low */
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(8)));
}

/* e4m3_value's arithmetic on 16 codes: the exponent rebiased from 7 to 127 where it is
 * not 0, multiples of 2^-9 where it is, and S.1111.111 the canonical NaN with its sign. */
static inline lanes fp8_codes(const uint8_t *c, int64_t i) {
    const __m512i code = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + i)));
    const __m512i magnitude = _mm512_and_si512(code, _mm512_set1_epi32(0x7f));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(code, _mm512_set1_epi32(0x80)), 24);
    const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(magnitude, 20),
                                            _mm512_set1_epi32((127 - 7) << 23));
    const __m512 small = _mm512_mul_ps(_mm512_cvtepi32_ps(magnitude), _mm512_set1_ps(0x1p-9f));
    const __mmask16 subnormal = _mm512_cmplt_epi32_mask(magnitude, _mm512_set1_epi32(8));
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7f));
    __m512i bits = _mm512_mask_mov_epi32(normal, subnormal, _mm512_castps_si512(small));
    bits = _mm512_mask_mov_epi32(bits, nan, _mm512_set1_epi32(0x7fc00000));
    return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
}
#elif defined(__AVX2__)
#define LANES 8
typedef __m256 lanes;
static inline lanes splat(float x) { return _mm256_set1_ps(x); }
static inline lanes dequantized(lanes q, lanes qmax, lanes absmax) {
    return _mm256_mul_ps(_mm256_div_ps(q, qmax), absmax);
}
static inline void store_past_caches(float *out, lanes x) { _mm256_stream_ps(out, x); }

static inline lanes int8_codes(const uint8_t *c, int64_t i) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c + i))));
}

static inline lanes int4_codes(const uint8_t *c, int64_t i) {
    int32_t four;
    memcpy(&four, c + i / 2, sizeof four);
    const __m128i bytes = _mm_cvtsi32_si128(four);
    const __m128i nibble = _mm_set1_epi8(0xf);
    const __m128i low = _mm_and_si128(bytes, nibble);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    const __m256i q = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(low, high)); /* element 2i low */
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8)));
}

/* As the AVX-512 fp8_codes, on 8 codes, the masks blended. */
static inline lanes fp8_codes(const uint8_t *c, int64_t i) {
    const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + i)));
    const __m256i magnitude = _mm256_and_si256(code, _mm256_set1_epi32(0x7f));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(0x80)), 24);
    const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(magnitude, 20),
                                            _mm256_set1_epi32((127 - 7) << 23));
    const __m256 small = _mm256_mul_ps(_mm256_cvtepi32_ps(magnitude), _mm256_set1_ps(0x1p-9f));
    const __m256i subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), magnitude);
    const __m256i nan = _mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7f));
    __m256i bits = _mm256_blendv_epi8(normal, _mm256_castps_si256(small), subnormal);
    bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000), nan);
    return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}
#endif

#ifdef LANES
typedef lanes (*codes_of)(const uint8_t *c, int64_t i);

/* Whether a decode writes its values past the caches (and returns 1, not 0): where the
 * caller asks (`stream`), every row starts on a cache line and holds whole lines.
 * Non-temporal stores neither read each line before writing it nor evict other data for
 * it: about twice as fast into an output not in the caches. */
static int streams(int64_t stream, int64_t block, const float *out) {
    return stream && block % 16 == 0 && (uintptr_t)out % 64 == 0;
}

/* x_hat = (q / qmax) * absmax, as the loops below, LANES values to a non-temporal store. */
static inline void stream_rows(codes_of codes_at, const float *scales, const uint8_t *codes,
                               int64_t row_bytes, int64_t rows, int64_t block, float qmax,
                               float *out) {
    const lanes top = splat(qmax);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *c = codes + r * row_bytes;
        const lanes absmax = splat(scales[r]);
        for (int64_t i = 0; i < block; i += LANES)
            store_past_caches(out + r * block + i, dequantized(codes_at(c, i), top, absmax));
    }
    _mm_sfence(); /* the streamed values before any later store */
}
#endif

int commpress_decode_int8(const float *scales, const int8_t *codes, int64_t rows, int64_t block,
                          float qmax, float *out, int64_t stream) {
#ifdef LANES
    if (streams(stream, block, out)) {
        stream_rows(int8_codes, scales, (const uint8_t *)codes, block, rows, block, qmax, out);
        return 1;
    }
#endif
    (void)stream;
    for (int64_t r = 0; r < rows; r++) {
        const int8_t *c = codes + r * block;
        float *o = out + r * block;
        const float absmax = scales[r];
        for (int64_t i = 0; i < block; i++) o[i] = ((float)c[i] / qmax) * absmax;
    }
    return 0;
}

int commpress_decode_int4(const float *scales, const uint8_t *codes, int64_t rows, int64_t block,
                          float qmax, float *out, int64_t stream) {
    if (block % 2) return -1;
#ifdef LANES
    if (streams(stream, block, out)) {
        stream_rows(int4_codes, scales, codes, block / 2, rows, block, qmax, out);
        return 1;
    }
#endif
    (void)stream;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *c = codes + r * (block / 2);
        float *o = out + r * block;
        const float absmax = scales[r];
        for (int64_t i = 0; i < block / 2; i++) {
            o[2 * i] = ((float)((int32_t)(c[i] & 0xf) - 8) / qmax) * absmax;
            o[2 * i + 1] = ((float)((int32_t)(c[i] >> 4) - 8) / qmax) * absmax;
        }
    }
    return 0;
}

/* float8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, and
 * S.1111.111 is NaN. Here |v| <= 448, the largest finite value (v = x / absmax * 448
 * with |x| <= absmax), so no code saturates. */
static inline uint8_t e4m3_code(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    const uint32_t sign = (bits >> 24) & 0x80, magnitude = bits & 0x7fffffffu;
    float a;
    memcpy(&a, &magnitude, sizeof a);
    /* Subnormal codes are the multiples of 2^-9 (8 * 2^-9 is the smallest normal). */
    const uint32_t small = (uint32_t)nearbyintf(a * 0x1p9f);
    /* Normal codes: keep 3 of the 23 mantissa bits, ties to even (a carry into the
     * exponent is the next power of two), and rebias the exponent from 127 to 7. */
    const uint32_t kept = magnitude + 0x7ffffu + ((magnitude >> 20) & 1u);
    const uint32_t normal = (kept >> 20) - ((127u - 7u) << 3);
    return (uint8_t)(sign | (a < 0x1p-6f ? small : normal));
}

static float e4m3_value(uint8_t code) {
    const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
    float a;
    if (exponent == 0xf && mantissa == 0x7)
        a = NAN;
    else if (exponent == 0)
        a = ldexpf((float)mantissa, -9);
    else
        a = ldexpf((float)(8 + mantissa), exponent - 10);
    return (code & 0x80) ? -a : a;
}

int commpress_encode_fp8(const float *x, const float *noise, int64_t rows, int64_t block,
                         float qmax, float *scales, uint8_t *codes) {
    if (noise != NULL) return -1; /* fp8 rounds to nearest only */
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * block;
        uint8_t *out = codes + r * block;
        const float a = scales[r] = block_absmax(xr, block);
        if (!usable(a)) {
            memset(out, 0, (size_t)block);
            continue;
        }
        for (int64_t i = 0; i < block; i++) out[i] = e4m3_code((xr[i] / a) * qmax);
    }
    return 0;
}

int commpress_decode_fp8(const float *scales, const uint8_t *codes, int64_t rows, int64_t block,
                         float qmax, float *out, int64_t stream) {
#ifdef LANES
    if (streams(stream, block, out)) {
        stream_rows(fp8_codes, scales, codes, block, rows, block, qmax, out);
        return 1;
    }
#endif
    (void)stream;
    float value[256];
    for (int c = 0; c < 256; c++) value[c] = e4m3_value((uint8_t)c);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *c = codes + r * block;
        float *o = out + r * block;
        const float absmax = scales[r];
        for (int64_t i = 0; i < block; i++) o[i] = (value[c[i]] / qmax) * absmax;
    }
    return 0;
}
