/*
 * The CPU twin of the reference "vector" backend: its three ops in plain C; the
 * C ABI around them comes from cuplug_cpu_backend.h, so every caller treats a
 * CPU fallback exactly like a CUDA variant.
 */
#include "cuplug_ops.h"

static int add(const cuplug_call* c) {
    for (long long i = 0; i < c->n; ++i) c->out[i] = c->x[i] + c->y[i];
    return CUPLUG_OK;
}

/* Two roundings (built with -ffp-contract=off): the same bits as the CUDA kernels. */
static int scale_add(const cuplug_call* c) {
    for (long long i = 0; i < c->n; ++i) c->out[i] = c->alpha * c->x[i] + c->beta;
    return CUPLUG_OK;
}

/* float64 accumulation in four independent lanes: exact enough for 1e8+ elements
 * (error ~ n * 2^-53) and fast, as the lanes break the add dependency chain. */
static int sum(const cuplug_call* c) {
    const float* x = c->x;
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    long long i = 0;
    for (; i + 4 <= c->n; i += 4) {
        a0 += x[i];
        a1 += x[i + 1];
        a2 += x[i + 2];
        a3 += x[i + 3];
    }
    for (; i < c->n; ++i) a0 += x[i];
    c->out[0] = (float)((a0 + a1) + (a2 + a3));
    return CUPLUG_OK;
}

static const cuplug_op cuplug_ops[] = {
    {"add", 2, CUPLUG_OUT_N, 1, add},
    {"scale_add", 1, CUPLUG_OUT_N, 1, scale_add},
    {"sum", 1, CUPLUG_OUT_ONE, 0, sum},
};

#include "cuplug_cpu_backend.h"
