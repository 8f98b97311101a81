/* The CPU twin of the `gemm` backend: C = A B of two row-major side x side float32 matrices, in plain C
 * (float64 accumulation), the same op table as cuda/gemm.cu. */
#include "cuplug_ops.h"

static int gemm(const cuplug_call* c) {
    const long long side = cuplug_attr_int(c, "side");
    if (side <= 0 || side > (1 << 15) || side * side != c->n)
        return cuplug_op_fail(c, "gemm: a and b must hold side*side elements (side=%lld), got %lld", side, c->n);
    const float* a = (const float*)c->in[0].data;
    const float* b = (const float*)c->in[1].data;
    float* out = (float*)c->out[0].data;
    for (long long i = 0; i < side; ++i)
        for (long long j = 0; j < side; ++j) {
            double acc = 0.0;
            for (long long k = 0; k < side; ++k) acc += (double)a[i * side + k] * (double)b[k * side + j];
            out[i * side + j] = (float)acc;
        }
    return CUPLUG_OK;
}

static const cuplug_op cuplug_ops[] = {
    {"gemm", gemm, 0,
     {CUPLUG_IN("a", CUPLUG_F32), CUPLUG_IN_LIKE("b", 0)},
     {CUPLUG_OUT_LIKE("c", 0)},
     {CUPLUG_ATTR_INT("side", 64)},
     {CUPLUG_SIZE(0, 0, 1, 0)},
     64 * 64},
};

#include "cuplug_cpu_backend.h"
