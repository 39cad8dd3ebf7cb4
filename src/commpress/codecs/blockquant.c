/*
 * Native CPU kernels for block-wise absmax integer quantization (int8, int4).
 *
 * They compute exactly what the plain-torch reference in blockwise.py computes,
 * bit for bit, so they must be built without value-changing optimizations:
 * -ffp-contract=off (no FMA fusion), and never -ffast-math.
 *
 *   absmax = max |x| over the block (NaN if the block holds a NaN)
 *   v      = (x / absmax) * qmax           when 0 < absmax < inf, else 0
 *   q      = nearbyint(v)                  or clamp(floor(v + noise), -qmax, qmax)
 *   x_hat  = (q / qmax) * absmax
 *
 * int8 codes are the two's-complement bytes of q; int4 codes are the nibbles
 * q + 8, element 2i in the low nibble of byte i.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* |x| compared as integers: for non-NaN floats, the order of (bits & 0x7fffffff)
 * is the order of |x|, and an integer max vectorizes without fast-math. */
static float block_absmax(const float *x, int64_t n) {
    uint32_t largest = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        bits &= 0x7fffffffu;
        largest = bits > largest ? bits : largest;
    }
    if (largest > 0x7f800000u) return NAN;
    float absmax;
    memcpy(&absmax, &largest, sizeof absmax);
    return absmax;
}

static int usable(float absmax) { return absmax > 0.0f && isfinite(absmax); }

static inline float nearest(float x, float absmax, float qmax) {
    return nearbyintf((x / absmax) * qmax);
}

static inline float stochastic(float x, float absmax, float qmax, float u) {
    float r = floorf((x / absmax) * qmax + u);
    return r < -qmax ? -qmax : (r > qmax ? qmax : r);
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
            for (int64_t i = 0; i < block; i++) out[i] = (int8_t)(int32_t)nearest(xr[i], a, qmax);
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
                for (int64_t i = 0; i < n; i++) q[i] = (int8_t)(int32_t)nearest(xc[i], a, qmax);
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
