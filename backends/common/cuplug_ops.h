/*
 * A backend's ops as data: the one thing a backend author writes besides kernels.
 *
 *   #include "cuplug_ops.h"
 *   static int prefix_sum(const cuplug_call* c) { ...; return CUPLUG_OK; }
 *   static const cuplug_op cuplug_ops[] = {
 *       {"prefix_sum", prefix_sum, 0,
 *        {CUPLUG_IN("x", CUPLUG_F32)},                 // inputs and their dtypes
 *        {CUPLUG_OUT_LIKE("out", 0)},                  // outputs: dtype + shape rules
 *        {{0}},                                        // attributes (none)
 *        {CUPLUG_SIZE(0, 0, 1, 0)}},                   // size rules on input 0's numel
 *   };
 *   #include "cuplug_cpu_backend.h"      (or "cuplug_cuda_backend.cuh")
 *
 * The included implementation defines every cuplug_backend_* entry point of
 * cuplug/backend.h around that table: the signature check of every call, resident
 * tensors, errors, host staging (CUDA), and the ping JSON, whose "ops" object is
 * this table as data (the Python loader validates calls and allocates outputs
 * from it before anything reaches C).
 *
 * The "ops" JSON of the ping (one entry per op, in table order):
 *   "add": {"inputs":  [{"name":"x","dtypes":["float16",...]}, {"name":"y","like":0}],
 *           (an input with a shape rule adds "shape": {...} as an output has)
 *           "outputs": [{"name":"out","dtype":{"like":0},"shape":{"like":0}}],
 *           "attrs":   [{"name":"alpha","kind":"float64","default":1.0}],
 *           "size_rules": [{"input":0,"multiple_of":4096,"min":4096,"max":null}],
 *           "elementwise": true, "sample_n": 1024}
 *   output dtype: {"like":k} | {"fixed":"int8"} | {"accum_of":k} (integers -> int64, floats as input k)
 *   output shape: {"like":k} | {"scalar":true} (shape ()) |
 *                 {"blocks_of":k,"attr":"blocksize"} (1-D, ceil(numel(k) / attr)) | {"attr":"n"} (1-D, attr)
 *   "like": k on an input: same dtype and shape as input k.
 */
#ifndef CUPLUG_OPS_H
#define CUPLUG_OPS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuplug/backend.h"

#ifndef CUPLUG_BACKEND_NAME
#define CUPLUG_BACKEND_NAME "vector"
#endif

/* ---- dtypes as a bit set (what an input accepts) ------------------------------ */
enum {
    CUPLUG_F16 = 1u << 0,
    CUPLUG_BF16 = 1u << 1,
    CUPLUG_F32 = 1u << 2,
    CUPLUG_F64 = 1u << 3,
    CUPLUG_I8 = 1u << 4,
    CUPLUG_U8 = 1u << 5,
    CUPLUG_I32 = 1u << 6,
    CUPLUG_I64 = 1u << 7,
    CUPLUG_U16 = 1u << 8,
    CUPLUG_U32 = 1u << 9,
    CUPLUG_U64 = 1u << 10,
    CUPLUG_BOOL = 1u << 11
};
#define CUPLUG_FLOATS (CUPLUG_F16 | CUPLUG_BF16 | CUPLUG_F32 | CUPLUG_F64)
/* The integers every framework computes with (PyTorch's CUDA kernels cover these; its uint16/32/64 are
 * storage types with few ops). CUPLUG_UNSIGNED adds the wider unsigned ones for an op that takes them. */
#define CUPLUG_INTS (CUPLUG_I8 | CUPLUG_U8 | CUPLUG_I32 | CUPLUG_I64)
#define CUPLUG_UNSIGNED (CUPLUG_U8 | CUPLUG_U16 | CUPLUG_U32 | CUPLUG_U64)
#define CUPLUG_NUMERIC (CUPLUG_FLOATS | CUPLUG_INTS)
#define CUPLUG_ALL_DTYPES (CUPLUG_NUMERIC | CUPLUG_UNSIGNED | CUPLUG_BOOL)
#define CUPLUG_DTYPE_COUNT 12

/* Bit i of the set above <-> its DLPack dtype and its name (NumPy's spelling). */
static const struct cuplug_dtype_entry {
    unsigned bit;
    cuplug_dtype dtype;
    const char* name;
    int size; /* bytes */
} cuplug_dtypes[CUPLUG_DTYPE_COUNT] = {
    {CUPLUG_F16, {CUPLUG_DTYPE_FLOAT, 16, 1}, "float16", 2},
    {CUPLUG_BF16, {CUPLUG_DTYPE_BFLOAT, 16, 1}, "bfloat16", 2},
    {CUPLUG_F32, {CUPLUG_DTYPE_FLOAT, 32, 1}, "float32", 4},
    {CUPLUG_F64, {CUPLUG_DTYPE_FLOAT, 64, 1}, "float64", 8},
    {CUPLUG_I8, {CUPLUG_DTYPE_INT, 8, 1}, "int8", 1},
    {CUPLUG_U8, {CUPLUG_DTYPE_UINT, 8, 1}, "uint8", 1},
    {CUPLUG_I32, {CUPLUG_DTYPE_INT, 32, 1}, "int32", 4},
    {CUPLUG_I64, {CUPLUG_DTYPE_INT, 64, 1}, "int64", 8},
    {CUPLUG_U16, {CUPLUG_DTYPE_UINT, 16, 1}, "uint16", 2},
    {CUPLUG_U32, {CUPLUG_DTYPE_UINT, 32, 1}, "uint32", 4},
    {CUPLUG_U64, {CUPLUG_DTYPE_UINT, 64, 1}, "uint64", 8},
    {CUPLUG_BOOL, {CUPLUG_DTYPE_BOOL, 8, 1}, "bool", 1},
};

/* The bit of a DLPack dtype, 0 if cuplug does not know it (or lanes != 1). */
static inline unsigned cuplug_dtype_bit(cuplug_dtype d) {
    for (int i = 0; i < CUPLUG_DTYPE_COUNT; ++i)
        if (cuplug_dtypes[i].dtype.code == d.code && cuplug_dtypes[i].dtype.bits == d.bits && d.lanes == 1)
            return cuplug_dtypes[i].bit;
    return 0;
}

/* ---- signatures ----------------------------------------------------------------- */
#define CUPLUG_MAX_ARGS 8
#define CUPLUG_MAX_SIZE_RULES 4

/* An input: the dtypes it accepts, or like = k + 1 (same dtype and shape as input k);
 * optionally a shape rule of its own, as an output has (CUPLUG_SHAPE_BLOCKS: 1-D,
 * ceil(numel(input k) / attr), e.g. the per-block scales a dequantize reads). */
typedef struct cuplug_input_spec {
    const char* name; /* NULL ends the list */
    unsigned dtypes;
    int like;               /* 0: none; k + 1: like input k */
    int shape_rule;         /* 0: any shape; CUPLUG_SHAPE_LIKE / _SCALAR / _BLOCKS / _ATTR / _EXPR */
    int shape_arg;          /* input k (before this one) */
    const char* shape_attr; /* the attribute of CUPLUG_SHAPE_BLOCKS / _ATTR; the expression of _EXPR */
} cuplug_input_spec;
#define CUPLUG_IN(name, dtypes) {(name), (dtypes), 0, 0, 0, NULL}
#define CUPLUG_IN_LIKE(name, k) {(name), 0, (k) + 1, 0, 0, NULL}
#define CUPLUG_IN_SHAPED(name, dtypes, shape_rule, k, attr) {(name), (dtypes), 0, (shape_rule), (k), (attr)}

enum { CUPLUG_DT_LIKE = 1, CUPLUG_DT_FIXED = 2, CUPLUG_DT_ACCUM = 3 };
enum { CUPLUG_SHAPE_LIKE = 1, CUPLUG_SHAPE_SCALAR = 2, CUPLUG_SHAPE_BLOCKS = 3, CUPLUG_SHAPE_ATTR = 4, CUPLUG_SHAPE_EXPR = 5 };
/* A shape expression (loader/cuplug/contract/shapeexpr.py has the grammar): terms separated by commas, each a
 * literal (4), an int64 attribute (bins), a dimension of an input (x[-1]) or a run of them (x[:-1]); "" or "()"
 * is a scalar. E.g. LayerNorm's mean CUPLUG_OUT_EXPR("mean", CUPLUG_DT_LIKE, 0, "x[:-1]"), its weight
 * CUPLUG_IN_EXPR("w", CUPLUG_F32, "x[-1]"), a histogram CUPLUG_OUT_EXPR("bins", CUPLUG_DT_FIXED, CUPLUG_U32, "bins"). */
#define CUPLUG_IN_EXPR(name, dtypes, expr) {(name), (dtypes), 0, CUPLUG_SHAPE_EXPR, 0, (expr)}

/* An output: its dtype rule (like input k / a fixed dtype bit / the accumulator of
 * input k) and its shape rule (like input k / a scalar / ceil(numel(k) / attr) /
 * attr elements). */
typedef struct cuplug_output_spec {
    const char* name; /* NULL ends the list */
    int dtype_rule;
    int dtype_arg; /* input k, or a CUPLUG_F16.. bit for CUPLUG_DT_FIXED */
    int shape_rule;
    int shape_arg;          /* input k */
    const char* shape_attr; /* the attribute of CUPLUG_SHAPE_BLOCKS / _ATTR; the expression of _EXPR */
} cuplug_output_spec;
#define CUPLUG_OUT(name, dtype_rule, dtype_arg, shape_rule, shape_arg, attr) \
    {(name), (dtype_rule), (dtype_arg), (shape_rule), (shape_arg), (attr)}
#define CUPLUG_OUT_LIKE(name, k) CUPLUG_OUT(name, CUPLUG_DT_LIKE, k, CUPLUG_SHAPE_LIKE, k, NULL)
#define CUPLUG_OUT_EXPR(name, dtype_rule, dtype_arg, expr) \
    CUPLUG_OUT(name, dtype_rule, dtype_arg, CUPLUG_SHAPE_EXPR, 0, expr)

/* An attribute with its kind and default (an int64 default is written as a double). */
typedef struct cuplug_attr_spec {
    const char* name; /* NULL ends the list */
    int kind;         /* cuplug_attr_kind */
    double def;
} cuplug_attr_spec;
#define CUPLUG_ATTR_INT(name, def) {(name), CUPLUG_ATTR_INT64, (double)(def)}
#define CUPLUG_ATTR_FLOAT(name, def) {(name), CUPLUG_ATTR_FLOAT64, (double)(def)}

/* A rule on the element count of input `input`; 0 means "no such bound". The
 * loader checks it before the call, naming the op and the rule. */
typedef struct cuplug_size_rule {
    int input;
    long long multiple_of, min, max;
} cuplug_size_rule;
#define CUPLUG_SIZE(input, multiple_of, min, max) {(input), (multiple_of), (min), (max)}

enum { CUPLUG_ELEMENTWISE = 1 }; /* out[i] depends on in[..][i] alone: the host path may run it in chunks */

struct cuplug_call;
typedef struct cuplug_op {
    const char* name;
    int (*fn)(const struct cuplug_call* call); /* CUPLUG_OK or a negative status */
    int flags;                                 /* CUPLUG_ELEMENTWISE */
    cuplug_input_spec inputs[CUPLUG_MAX_ARGS];
    cuplug_output_spec outputs[CUPLUG_MAX_ARGS];
    cuplug_attr_spec attrs[CUPLUG_MAX_ARGS];
    cuplug_size_rule sizes[CUPLUG_MAX_SIZE_RULES]; /* an entry of all zeros ends the list */
    long long sample_n; /* numel of input 0 in probe/warmup samples; 0: the smallest that fits the size rules, else 1024 */
} cuplug_op;

/*
 * One call of an op, as the framework hands it over after the signature check:
 * every tensor C-contiguous, with byte_offset folded into data (byte_offset 0),
 * on the device the op runs on (device pointers on CUDA, staged if the caller
 * passed host tensors; host pointers on the CPU). For an elementwise op the host
 * path may pass 1-D chunks: such an op must depend on numel only.
 */
typedef struct cuplug_call {
    const cuplug_op* op;
    const cuplug_tensor* in;
    int n_in;
    cuplug_tensor* out;
    int n_out;
    const cuplug_attr* attrs; /* one per op->attrs entry, in that order, defaults filled, kind as declared */
    int n_attrs;
    long long n;    /* numel of in[0] (of the chunk on a chunked host path) */
    void* stream;   /* cudaStream_t to launch on (CUDA only) */
    int sm_count;   /* multiprocessors of the device (CUDA only) */
    void* backend;  /* the instance, for cuplug_cuda_scratch() */
    char* error;    /* where cuplug_op_fail() writes the op's own message */
    size_t error_len;
} cuplug_call;

#define CUPLUG_OP_COUNT(table) ((int)(sizeof(table) / sizeof((table)[0])))

static inline long long cuplug_numel(const cuplug_tensor* t) {
    long long n = 1;
    for (int i = 0; i < t->ndim; ++i) n *= (long long)t->shape[i];
    return n;
}

static inline const char* cuplug_dtype_name(cuplug_dtype d) {
    for (int i = 0; i < CUPLUG_DTYPE_COUNT; ++i)
        if (cuplug_dtypes[i].bit == cuplug_dtype_bit(d)) return cuplug_dtypes[i].name;
    return "unknown";
}

/* The value of attribute `name` of this call (as int64 / as float64); 0 if the op declares none. */
static inline const cuplug_attr* cuplug_call_attr(const cuplug_call* c, const char* name) {
    for (int i = 0; i < c->n_attrs; ++i)
        if (c->attrs[i].name != NULL && strcmp(c->attrs[i].name, name) == 0) return &c->attrs[i];
    return NULL;
}
static inline int64_t cuplug_attr_int(const cuplug_call* c, const char* name) {
    const cuplug_attr* a = cuplug_call_attr(c, name);
    return a == NULL ? 0 : (a->kind == CUPLUG_ATTR_INT64 ? a->value.i : (int64_t)a->value.f);
}
static inline double cuplug_attr_float(const cuplug_call* c, const char* name) {
    const cuplug_attr* a = cuplug_call_attr(c, name);
    return a == NULL ? 0.0 : (a->kind == CUPLUG_ATTR_FLOAT64 ? a->value.f : (double)a->value.i);
}

/* The op's own error: the message reaches Python as the exception text.
 *   return cuplug_op_fail(c, "n must be a multiple of 4096, got %lld", c->n);   */
static inline int cuplug_op_fail(const cuplug_call* c, const char* fmt, ...) {
    if (c->error != NULL && c->error_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->error, c->error_len, fmt, ap);
        va_end(ap);
    }
    return CUPLUG_E_INVALID_ARGUMENT;
}

static inline const cuplug_op* cuplug_find_op(const cuplug_op* ops, int count, const char* name) {
    if (name == NULL) return NULL;
    for (int i = 0; i < count; ++i)
        if (strcmp(ops[i].name, name) == 0) return &ops[i];
    return NULL;
}

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
