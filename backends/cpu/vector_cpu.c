/*
 * The CPU twin of the reference "vector" backend: its three ops in plain C for
 * every dtype they declare; the C ABI around them comes from
 * cuplug_cpu_backend.h, so every caller treats a CPU fallback exactly like a
 * CUDA variant. Built with -ffp-contract=off: no FMA contraction, so each
 * multiply and add rounds on its own, as PyTorch's and the CUDA kernels do.
 *
 *   add        out = x + y             integers wrap (two's complement); float16 and
 *                                      bfloat16 computed in float32, rounded once
 *   scale_add  out = x * alpha + beta  two roundings, bit-exact with PyTorch's
 *                                      `x * alpha + beta` (alpha, beta as float32 for
 *                                      float16/bfloat16/float32); integers need
 *                                      integral alpha and beta and wrap
 *   sum        out = sum(x)            a scalar; integers -> int64 (wrapping),
 *                                      floats accumulate in float64 (4 lanes, a fixed
 *                                      order: deterministic), rounded once to the dtype
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuplug_ops.h"

/* ---- float16 / bfloat16 <-> float32, IEEE round-to-nearest-even ---------------------- */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Exact (every float16 is a float32); a NaN comes out quiet, its payload kept. */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u));
    if (e == 0) {
        if (m == 0) return bits_f32(sign);
        e = 113; /* a subnormal: m * 2^-24, normalized */
        while ((m & 0x400u) == 0) m <<= 1, --e;
        return bits_f32(sign | (e << 23) | ((m & 0x3ffu) << 13));
    }
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* Round-to-nearest-even, subnormals included; overflow -> inf; NaN -> quiet NaN. */
static inline uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f), a = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (or inf): inf */
    if (a >= 0x38800000u) {                                  /* normal: >= 2^-14 */
        uint32_t r = a - 0x38000000u;                         /* rebias 127 -> 15 */
        r += 0x0fffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a <= 0x33000000u) return sign; /* <= 2^-25: rounds to zero (2^-25 ties to even) */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24: m * 2^(e - 150) in units of 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return (uint16_t)(sign | q);
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
    return bits_f32(u);
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* A double to float with round-to-odd: rounding that to float16/bfloat16 (RNE) then
 * gives the correctly rounded result of the double (float has >= 2 more bits). */
static inline float f64_to_f32_odd(double d) {
    float f = (float)d;
    if (d == d && (double)f != d) {
        uint32_t u = f32_bits(f);
        if ((u & 1u) == 0) u = fabs((double)f) > fabs(d) ? u - 1u : u + 1u;
        f = bits_f32(u);
    }
    return f;
}
static inline uint16_t f64_to_f16(double d) { return f32_to_f16(f64_to_f32_odd(d)); }
static inline uint16_t f64_to_bf16(double d) { return f32_to_bf16(f64_to_f32_odd(d)); }

/* ---- add -------------------------------------------------------------------------------- */

#define CUPLUG_LOOP(T, expr)                                                      \
    do {                                                                          \
        const T* x = (const T*)c->in[0].data;                                     \
        T* o = (T*)c->out[0].data;                                                \
        for (long long i = 0; i < c->n; ++i) o[i] = (T)(expr);                    \
    } while (0)
#define CUPLUG_LOOP2(T, expr)                                                     \
    do {                                                                          \
        const T* x = (const T*)c->in[0].data;                                     \
        const T* y = (const T*)c->in[1].data;                                     \
        T* o = (T*)c->out[0].data;                                                \
        for (long long i = 0; i < c->n; ++i) o[i] = (T)(expr);                    \
    } while (0)

static int add(const cuplug_call* c) {
    switch (cuplug_dtype_bit(c->in[0].dtype)) {
        case CUPLUG_F16: CUPLUG_LOOP2(uint16_t, f32_to_f16(f16_to_f32(x[i]) + f16_to_f32(y[i]))); break;
        case CUPLUG_BF16: CUPLUG_LOOP2(uint16_t, f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]))); break;
        case CUPLUG_F32: CUPLUG_LOOP2(float, x[i] + y[i]); break;
        case CUPLUG_F64: CUPLUG_LOOP2(double, x[i] + y[i]); break;
        /* two's complement: signed and unsigned addition give the same bits */
        case CUPLUG_I8:
        case CUPLUG_U8: CUPLUG_LOOP2(uint8_t, (unsigned)x[i] + (unsigned)y[i]); break;
        case CUPLUG_I32: CUPLUG_LOOP2(uint32_t, x[i] + y[i]); break;
        case CUPLUG_I64: CUPLUG_LOOP2(uint64_t, x[i] + y[i]); break;
        default: return cuplug_op_fail(c, "add: dtype %s not implemented", cuplug_dtype_name(c->in[0].dtype));
    }
    return CUPLUG_OK;
}

/* ---- scale_add ---------------------------------------------------------------------------- */

static int scale_add(const cuplug_call* c) {
    const double alpha = cuplug_attr_float(c, "alpha"), beta = cuplug_attr_float(c, "beta");
    const unsigned bit = cuplug_dtype_bit(c->in[0].dtype);
    if (bit & CUPLUG_INTS) {
        const double lim = 9223372036854775808.0; /* 2^63 */
        if (alpha != floor(alpha) || beta != floor(beta) || !(alpha >= -lim && alpha < lim) ||
            !(beta >= -lim && beta < lim))
            return cuplug_op_fail(c,
                                  "scale_add: alpha and beta must be integers for an %s tensor, got alpha=%.17g, "
                                  "beta=%.17g",
                                  cuplug_dtype_name(c->in[0].dtype), alpha, beta);
        /* x * alpha + beta modulo 2^64, truncated: the wrapping result in the dtype */
        const uint64_t a = (uint64_t)(int64_t)alpha, b = (uint64_t)(int64_t)beta;
        switch (bit) {
            case CUPLUG_I8: CUPLUG_LOOP(int8_t, (uint8_t)((uint64_t)(int64_t)x[i] * a + b)); break;
            case CUPLUG_U8: CUPLUG_LOOP(uint8_t, (uint8_t)((uint64_t)x[i] * a + b)); break;
            case CUPLUG_I32: CUPLUG_LOOP(int32_t, (uint32_t)((uint64_t)(int64_t)x[i] * a + b)); break;
            default: CUPLUG_LOOP(uint64_t, x[i] * a + b); break;
        }
        return CUPLUG_OK;
    }
    const float af = (float)alpha, bf = (float)beta;
    switch (bit) {
        case CUPLUG_F16: CUPLUG_LOOP(uint16_t, f32_to_f16(f16_to_f32(f32_to_f16(f16_to_f32(x[i]) * af)) + bf)); break;
        case CUPLUG_BF16:
            CUPLUG_LOOP(uint16_t, f32_to_bf16(bf16_to_f32(f32_to_bf16(bf16_to_f32(x[i]) * af)) + bf));
            break;
        case CUPLUG_F32: {
            const float* x = (const float*)c->in[0].data;
            float* o = (float*)c->out[0].data;
            for (long long i = 0; i < c->n; ++i) {
                float t = af * x[i]; /* rounded to float here (-ffp-contract=off) */
                o[i] = t + bf;
            }
            break;
        }
        case CUPLUG_F64: {
            const double* x = (const double*)c->in[0].data;
            double* o = (double*)c->out[0].data;
            for (long long i = 0; i < c->n; ++i) {
                double t = alpha * x[i];
                o[i] = t + beta;
            }
            break;
        }
        default: return cuplug_op_fail(c, "scale_add: dtype %s not implemented", cuplug_dtype_name(c->in[0].dtype));
    }
    return CUPLUG_OK;
}

/* ---- sum ---------------------------------------------------------------------------------- */

/* float64 accumulation in four independent lanes: exact enough for 1e8+ elements
 * (error ~ n * 2^-53) and fast, as the lanes break the add dependency chain. The
 * order is fixed, so the result is deterministic. */
#define CUPLUG_SUM_F64(T, load)                                                   \
    do {                                                                          \
        const T* x = (const T*)c->in[0].data;                                     \
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;                                    \
        long long i = 0;                                                          \
        for (; i + 4 <= c->n; i += 4) {                                           \
            a0 += load(x[i]);                                                     \
            a1 += load(x[i + 1]);                                                 \
            a2 += load(x[i + 2]);                                                 \
            a3 += load(x[i + 3]);                                                 \
        }                                                                         \
        for (; i < c->n; ++i) a0 += load(x[i]);                                   \
        acc = (a0 + a1) + (a2 + a3);                                              \
    } while (0)
/* integers: int64 modulo 2^64 (uint64 arithmetic), any order gives the same bits */
#define CUPLUG_SUM_INT(T)                                                         \
    do {                                                                          \
        const T* x = (const T*)c->in[0].data;                                     \
        for (long long i = 0; i < c->n; ++i) iacc += (uint64_t)(int64_t)x[i];     \
    } while (0)

#define CUPLUG_LOAD_F16(v) ((double)f16_to_f32(v))
#define CUPLUG_LOAD_BF16(v) ((double)bf16_to_f32(v))
#define CUPLUG_LOAD_PLAIN(v) ((double)(v))

static int sum(const cuplug_call* c) {
    double acc = 0.0; /* a sum of nothing (n == 0) is 0 */
    uint64_t iacc = 0;
    void* o = c->out[0].data;
    switch (cuplug_dtype_bit(c->in[0].dtype)) {
        case CUPLUG_F16: CUPLUG_SUM_F64(uint16_t, CUPLUG_LOAD_F16); *(uint16_t*)o = f64_to_f16(acc); break;
        case CUPLUG_BF16: CUPLUG_SUM_F64(uint16_t, CUPLUG_LOAD_BF16); *(uint16_t*)o = f64_to_bf16(acc); break;
        case CUPLUG_F32: CUPLUG_SUM_F64(float, CUPLUG_LOAD_PLAIN); *(float*)o = (float)acc; break;
        case CUPLUG_F64: CUPLUG_SUM_F64(double, CUPLUG_LOAD_PLAIN); *(double*)o = acc; break;
        case CUPLUG_I8: CUPLUG_SUM_INT(int8_t); memcpy(o, &iacc, sizeof iacc); break;
        case CUPLUG_U8: CUPLUG_SUM_INT(uint8_t); memcpy(o, &iacc, sizeof iacc); break;
        case CUPLUG_I32: CUPLUG_SUM_INT(int32_t); memcpy(o, &iacc, sizeof iacc); break;
        case CUPLUG_I64: CUPLUG_SUM_INT(int64_t); memcpy(o, &iacc, sizeof iacc); break;
        default: return cuplug_op_fail(c, "sum: dtype %s not implemented", cuplug_dtype_name(c->in[0].dtype));
    }
    return CUPLUG_OK;
}

/* Positional initializers: trailing fields (attrs, size rules, sample_n) omitted on purpose. */
static const cuplug_op cuplug_ops[] = {
    {"add", add, CUPLUG_ELEMENTWISE,
     {CUPLUG_IN("x", CUPLUG_NUMERIC), CUPLUG_IN_LIKE("y", 0)},
     {CUPLUG_OUT_LIKE("out", 0)}},
    {"scale_add", scale_add, CUPLUG_ELEMENTWISE,
     {CUPLUG_IN("x", CUPLUG_NUMERIC)},
     {CUPLUG_OUT_LIKE("out", 0)},
     {CUPLUG_ATTR_FLOAT("alpha", 1.0), CUPLUG_ATTR_FLOAT("beta", 0.0)}},
    {"sum", sum, 0,
     {CUPLUG_IN("x", CUPLUG_NUMERIC)},
     {CUPLUG_OUT("out", CUPLUG_DT_ACCUM, 0, CUPLUG_SHAPE_SCALAR, 0, NULL)}},
};

#include "cuplug_cpu_backend.h"
