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
#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* |x| compared as integers: for non-NaN floats, the order of (bits & 0x7fffffff)
 * is the order of |x|, and an integer max needs no fast-math to vectorize. */
static float block_absmax(const float *x, int64_t n) {
    uint32_t largest = 0;
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    __m512i lanes = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16)
        lanes = _mm512_max_epu32(lanes, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
    largest = _mm512_reduce_max_epu32(lanes);
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

int commpress_decode_int8(const float *scales, const int8_t *codes, int64_t rows, int64_t block,
                          float qmax, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const int8_t *c = codes + r * block;
        float *o = out + r * block;
        const float absmax = scales[r];
        for (int64_t i = 0; i < block; i++) o[i] = ((float)c[i] / qmax) * absmax;
    }
    return 0;
}

int commpress_decode_int4(const float *scales, const uint8_t *codes, int64_t rows, int64_t block,
                          float qmax, float *out) {
    if (block % 2) return -1;
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
                         float qmax, float *out) {
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
