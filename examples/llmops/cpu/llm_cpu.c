/*
 * The CPU twin of `llm`: the four ops in plain C. It calls libm (expf, tanhf, sqrt); cuplug_add_cpu_backend()
 * force-includes cuplug/glibc_floor.h, so the twin stays manylinux_2_17 whatever glibc builds it.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuplug_ops.h"

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static long long last_dim(const cuplug_tensor* t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

static int layernorm(const cuplug_call* c) {
    const float *x = c->in[0].data, *w = c->in[1].data, *b = c->in[2].data;
    float *y = c->out[0].data, *mean = c->out[1].data, *rstd = c->out[2].data;
    const long long C = last_dim(&c->in[0]), rows = C ? c->n / C : 0;
    if (C == 0) return cuplug_op_fail(c, "layernorm: x's last dimension is 0: no row to reduce");
    const double eps = cuplug_attr_float(c, "eps");
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * C;
        double m = 0, v = 0;
        for (long long i = 0; i < C; ++i) m += xr[i];
        m /= (double)C;
        for (long long i = 0; i < C; ++i) v += (xr[i] - m) * (xr[i] - m);
        const float s = (float)(1.0 / sqrt(v / (double)C + eps));
        for (long long i = 0; i < C; ++i) y[r * C + i] = (float)(xr[i] - m) * s * w[i] + b[i];
        mean[r] = (float)m, rstd[r] = s;
    }
    return CUPLUG_OK;
}

static int histogram(const cuplug_call* c) {
    const uint8_t* x = c->in[0].data;
    uint32_t* h = c->out[0].data;
    const long long bins = c->out[0].shape[0];
    memset(h, 0, sizeof(uint32_t) * (size_t)bins);
    for (long long i = 0; i < c->n; ++i)
        if (x[i] < bins) ++h[x[i]];
    return CUPLUG_OK;
}

static int gelu(const cuplug_call* c) {
    const uint16_t* x = c->in[0].data;
    uint16_t* o = c->out[0].data;
    for (long long i = 0; i < c->n; ++i) {
        const float v = bf16_to_f32(x[i]);
        o[i] = f32_to_bf16(0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))));
    }
    return CUPLUG_OK;
}

static int softmax(const cuplug_call* c) {
    const float* x = c->in[0].data;
    float* o = c->out[0].data;
    const long long C = last_dim(&c->in[0]), rows = C ? c->n / C : 0;
    if (C == 0) return cuplug_op_fail(c, "softmax: x's last dimension is 0: no row to reduce");
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * C;
        float m = -INFINITY;
        double s = 0;
        for (long long i = 0; i < C; ++i) m = fmaxf(m, xr[i]);
        for (long long i = 0; i < C; ++i) s += expf(xr[i] - m);
        for (long long i = 0; i < C; ++i) o[r * C + i] = (float)(expf(xr[i] - m) / s);
    }
    return CUPLUG_OK;
}

#include "../common/llm_ops_table.h"
#include "cuplug_cpu_backend.h"
