/*
 * A backend's ops as data: the one thing a backend author writes besides kernels.
 *
 *   #include "cuplug_ops.h"
 *   static int prefix_sum(const cuplug_call* c) { ...; return CUPLUG_OK; }
 *   static const cuplug_op cuplug_ops[] = {
 *       {"prefix_sum", 1, CUPLUG_OUT_N, 0, prefix_sum},
 *   };
 *   #include "cuplug_cpu_backend.h"      (or "cuplug_cuda_backend.cuh")
 *
 * The included implementation defines every cuplug_backend_* entry point of
 * cuplug/backend.h around that table: argument checks, resident buffers, errors,
 * host staging (CUDA), and the ping JSON, whose "ops" object tells the Python
 * loader each op's operand count and result size.
 */
#ifndef CUPLUG_OPS_H
#define CUPLUG_OPS_H

#include <stdio.h>
#include <string.h>

#include "cuplug/backend.h"

#ifndef CUPLUG_BACKEND_NAME
#define CUPLUG_BACKEND_NAME "vector"
#endif

/* What an op returns: n elements (like its input) or one element (a reduction). */
enum { CUPLUG_OUT_N = 0, CUPLUG_OUT_ONE = 1 };

/* One call of an op. On CUDA, x/y/out are device pointers and `stream` the
 * cudaStream_t to launch on; on the CPU they are host pointers. */
typedef struct cuplug_call {
    const float* x;
    const float* y; /* NULL for one-input ops */
    float alpha, beta;
    float* out;
    long long n;
    void* stream;   /* cudaStream_t (CUDA only) */
    int sm_count;   /* multiprocessors of the device (CUDA only) */
    void* backend;  /* the instance, for cuplug_cuda_scratch() */
} cuplug_call;

typedef struct cuplug_op {
    const char* name;
    int inputs;      /* 1 or 2 */
    int out;         /* CUPLUG_OUT_N or CUPLUG_OUT_ONE */
    int elementwise; /* out[i] depends on x[i] (and y[i]) alone: the host path may run it in chunks */
    int (*fn)(const cuplug_call* call); /* CUPLUG_OK or a negative status */
} cuplug_op;

static inline const cuplug_op* cuplug_find_op(const cuplug_op* ops, int count, const char* name) {
    if (name == NULL) return NULL;
    for (int i = 0; i < count; ++i)
        if (strcmp(ops[i].name, name) == 0) return &ops[i];
    return NULL;
}

/* "add, scale_add or sum": for error messages. */
static inline void cuplug_op_names(const cuplug_op* ops, int count, char* buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < count && used < len; ++i) {
        const char* sep = i == 0 ? "" : (i == count - 1 ? " or " : ", ");
        int w = snprintf(buf + used, len - used, "%s%s", sep, ops[i].name);
        if (w < 0) break;
        used += (size_t)w;
    }
}

/* {"add":{"inputs":2,"out":"n"},...}: the op table for the loader, in the ping JSON. */
static inline void cuplug_ops_json(const cuplug_op* ops, int count, char* buf, size_t len) {
    size_t used = 0;
    int w = snprintf(buf, len, "{");
    used = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < count && used < len; ++i) {
        w = snprintf(buf + used, len - used, "%s\"%s\":{\"inputs\":%d,\"out\":\"%s\"}", i ? "," : "",
                     ops[i].name, ops[i].inputs, ops[i].out == CUPLUG_OUT_ONE ? "1" : "n");
        if (w < 0) break;
        used += (size_t)w;
    }
    if (used < len) snprintf(buf + used, len - used, "}");
}

#define CUPLUG_OP_COUNT(table) ((int)(sizeof(table) / sizeof((table)[0])))

#ifdef __CUDACC__
/* Temporary device memory for a non-elementwise op (defined by cuplug_cuda_backend.cuh). */
void* cuplug_cuda_scratch(const cuplug_call* call, size_t bytes);

/* A grid for `items` work items of `threads` each: at most 16 blocks per
 * multiprocessor (grid-stride kernels cover the rest), at least one. For
 * reductions, whose per-block partials are then few. */
static inline int cuplug_cuda_blocks(const cuplug_call* call, long long items, int threads) {
    long long want = (items + threads - 1) / threads, cap = (long long)call->sm_count * 16;
    return (int)(want < 1 ? 1 : (want > cap ? cap : want));
}

/* One work item per thread (capped at 2^31 - 1 blocks; grid-stride kernels cover
 * the rest). For streaming elementwise kernels: on the H200 this reached
 * 4380 GB/s on 1 GiB arrays, the 16-per-SM grid 4072 (bench/kernel_shapes.cu). */
static inline int cuplug_cuda_full_grid(long long items, int threads) {
    long long want = (items + threads - 1) / threads;
    return (int)(want < 1 ? 1 : (want > 2147483647LL ? 2147483647LL : want));
}
#endif

#endif /* CUPLUG_OPS_H */
