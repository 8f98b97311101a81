/* The CPU twin of the `scan` backend: the same op in plain C; cuplug's
 * cuplug_cpu_backend.h supplies the whole C ABI around it. */
#include "cuplug_ops.h"

/* Inclusive prefix sum, accumulated in float64. */
static int prefix_sum(const cuplug_call* c) {
    double running = 0.0;
    for (long long i = 0; i < c->n; ++i) {
        running += c->x[i];
        c->out[i] = (float)running;
    }
    return CUPLUG_OK;
}

static const cuplug_op cuplug_ops[] = {
    {"prefix_sum", 1, CUPLUG_OUT_N, 0, prefix_sum},
};

#include "cuplug_cpu_backend.h"
