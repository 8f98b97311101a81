/* The CPU twin of the `scan` backend: the same ops in plain C; cuplug's
 * cuplug_cpu_backend.h supplies the whole C ABI around them. */
#include <stdint.h>
#include <string.h>

#include "cuplug_ops.h"

/* Inclusive prefix sum, accumulated in float64. */
static int prefix_sum(const cuplug_call* c) {
    const float* x = (const float*)c->in[0].data;
    float* out = (float*)c->out[0].data;
    double running = 0.0;
    for (long long i = 0; i < c->n; ++i) {
        running += x[i];
        out[i] = (float)running;
    }
    return CUPLUG_OK;
}

/* IEEE binary16 -> float32, exact (subnormals, infinities and NaN included). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalize */
        int e = -1;
        do {
            man <<= 1;
            ++e;
        } while ((man & 0x400u) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The CUDA kernel's order: 256 strided float32 partials, folded as a tree. */
static int segment_sum(const cuplug_call* c) {
    const long long segment = cuplug_attr_int(c, "segment");
    if (segment <= 0 || segment % 256 != 0 || c->n % segment != 0)
        return cuplug_op_fail(c, "segment_sum: segment must be a positive multiple of 256 dividing n=%lld, got %lld",
                              c->n, segment);
    const int half = c->in[0].dtype.bits == 16;
    float* out = (float*)c->out[0].data;
    for (long long s = 0; s * segment < c->n; ++s) {
        float partial[256];
        for (int t = 0; t < 256; ++t) {
            float acc = 0.0f;
            for (long long i = t; i < segment; i += 256) {
                long long k = s * segment + i;
                acc += half ? half_to_float(((const uint16_t*)c->in[0].data)[k]) : ((const float*)c->in[0].data)[k];
            }
            partial[t] = acc;
        }
        for (int w = 128; w > 0; w >>= 1)
            for (int t = 0; t < w; ++t) partial[t] += partial[t + w];
        out[s] = partial[0];
    }
    return CUPLUG_OK;
}

static const cuplug_op cuplug_ops[] = {
    {"prefix_sum", prefix_sum, 0, {CUPLUG_IN("x", CUPLUG_F32)}, {CUPLUG_OUT_LIKE("out", 0)}},
    {"segment_sum", segment_sum, 0,
     {CUPLUG_IN("x", CUPLUG_F16 | CUPLUG_F32)},
     {CUPLUG_OUT("sums", CUPLUG_DT_FIXED, CUPLUG_F32, CUPLUG_SHAPE_BLOCKS, 0, "segment")},
     {CUPLUG_ATTR_INT("segment", 4096)},
     {CUPLUG_SIZE(0, 256, 256, 0)},
     4096},
};

#include "cuplug_cpu_backend.h"
