/*
 * An op's signature (cuplug_ops.h) put to work, for every backend framework
 * (C11 and nvcc C++17 alike; header-only, static inline):
 *   cuplug_check_call()  validates one call against its op before any work;
 *   cuplug_ops_json()    writes the ping's "ops" object;
 *   cuplug_op_names()    "add, scale_add or sum", for "unknown op" messages.
 *
 * Zero-element tensors are valid everywhere: an elementwise op's outputs then
 * have 0 elements too and the framework launches nothing; a reduction of
 * nothing gives its identity (sum: 0), so the framework does call a
 * non-elementwise op with n == 0 and the op must write its outputs. Strides of
 * a tensor with 0 elements are not checked (every layout of nothing is
 * contiguous), nor those of dimensions of extent 1 (as NumPy and PyTorch).
 *
 * Device types are NOT checked here: each framework does (the CPU accepts CPU
 * and CUDA-host tensors, the CUDA backend its device plus host tensors).
 */
#ifndef CUPLUG_SIGNATURE_H
#define CUPLUG_SIGNATURE_H

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuplug_common.h"
#include "cuplug_ops.h"

/* ---- counts ------------------------------------------------------------------------ */
static inline int cuplug_op_n_inputs(const cuplug_op* op) {
    int n = 0;
    while (n < CUPLUG_MAX_ARGS && op->inputs[n].name != NULL) ++n;
    return n;
}
static inline int cuplug_op_n_outputs(const cuplug_op* op) {
    int n = 0;
    while (n < CUPLUG_MAX_ARGS && op->outputs[n].name != NULL) ++n;
    return n;
}
static inline int cuplug_op_n_attrs(const cuplug_op* op) {
    int n = 0;
    while (n < CUPLUG_MAX_ARGS && op->attrs[n].name != NULL) ++n;
    return n;
}
static inline int cuplug_op_n_size_rules(const cuplug_op* op) {
    int n = 0;
    while (n < CUPLUG_MAX_SIZE_RULES) {
        const cuplug_size_rule* r = &op->sizes[n];
        if (r->input == 0 && r->multiple_of == 0 && r->min == 0 && r->max == 0) break;
        ++n;
    }
    return n;
}

/* ---- a growing text, counted like snprintf (buf may be NULL) ------------------------- */
typedef struct cuplug_text {
    char* buf;
    size_t len;  /* capacity of buf */
    size_t used; /* length written so far, or needed if buf is too short */
} cuplug_text;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline void cuplug_text_printf(cuplug_text* t, const char* fmt, ...) {
    va_list ap;
    char dummy[1];
    va_start(ap, fmt);
    int w;
    if (t->buf != NULL && t->used < t->len)
        w = vsnprintf(t->buf + t->used, t->len - t->used, fmt, ap);
    else
        w = vsnprintf(dummy, 0, fmt, ap);
    va_end(ap);
    if (w > 0) t->used += (size_t)w;
}

/* A JSON string: quotes, backslash and control characters escaped; other bytes as they are (UTF-8). */
static inline void cuplug_text_json_string(cuplug_text* t, const char* s) {
    cuplug_text_printf(t, "\"");
    for (const unsigned char* p = (const unsigned char*)(s ? s : ""); *p; ++p) {
        if (*p == '"' || *p == '\\')
            cuplug_text_printf(t, "\\%c", *p);
        else if (*p < 0x20)
            cuplug_text_printf(t, "\\u%04x", *p);
        else
            cuplug_text_printf(t, "%c", *p);
    }
    cuplug_text_printf(t, "\"");
}

/* A float64 as JSON: the shortest %.*g that reads back to the same double, with ".0"
 * if it would read as an integer; null if not finite (JSON has no inf/nan). */
static inline void cuplug_text_json_double(cuplug_text* t, double v) {
    if (!(v == v) || v == HUGE_VAL || v == -HUGE_VAL) {
        cuplug_text_printf(t, "null");
        return;
    }
    char s[40];
    for (int prec = 15; prec <= 17; ++prec) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (strtod(s, NULL) == v) break;
    }
    int plain = strpbrk(s, ".eEn") == NULL;
    cuplug_text_printf(t, "%s%s", s, plain ? ".0" : "");
}

/* An int64 attribute's default is stored as a double (CUPLUG_ATTR_INT): INT64_MAX rounds up to 2^63, which no
 * int64 holds (converting it is undefined behaviour: x86-64 gives INT64_MIN). Clamped to int64's range. */
static inline long long cuplug_int_default(double def) {
    if (def >= 9223372036854775807.0) return LLONG_MAX;
    if (def <= -9223372036854775808.0) return LLONG_MIN;
    return (long long)def;
}

static inline long long cuplug_gcd_ll(long long a, long long b) {
    while (b != 0) {
        long long r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/*
 * numel of input 0 in the op's probe/warmup samples: op->sample_n if set;
 * otherwise, if input 0 has multiple_of or min rules, the smallest n >= 1 that
 * satisfies them all (lcm of the multiples, rounded up to the largest min);
 * otherwise 1024, clamped by the smallest max on input 0.
 */
static inline long long cuplug_op_sample_n(const cuplug_op* op) {
    if (op->sample_n > 0) return op->sample_n;
    long long multiple = 1, lo = 1, hi = 0;
    int constrained = 0;
    for (int k = 0; k < cuplug_op_n_size_rules(op); ++k) {
        const cuplug_size_rule* r = &op->sizes[k];
        if (r->input != 0) continue;
        if (r->multiple_of > 0) {
            long long g = cuplug_gcd_ll(multiple, r->multiple_of);
            multiple = multiple / g * r->multiple_of;
            constrained = 1;
        }
        if (r->min > 0) {
            if (r->min > lo) lo = r->min;
            constrained = 1;
        }
        if (r->max > 0 && (hi == 0 || r->max < hi)) hi = r->max;
    }
    if (!constrained) return hi > 0 && hi < 1024 ? hi : 1024;
    return (lo + multiple - 1) / multiple * multiple;
}

/* The dtype table entry of a dtype bit (CUPLUG_F16..), or NULL. */
static inline const struct cuplug_dtype_entry* cuplug_dtype_entry_of_bit(unsigned bit) {
    for (int i = 0; i < CUPLUG_DTYPE_COUNT; ++i)
        if (cuplug_dtypes[i].bit == bit) return &cuplug_dtypes[i];
    return NULL;
}

/*
 * The "ops" JSON object of the ping (format: cuplug_ops.h), for `count` ops in
 * table order. Writes into (buf, len) NUL-terminated when len > 0 and returns
 * the length needed without the NUL, as snprintf does: call it with (NULL, 0)
 * for the size, then with a buffer of size + 1. Never truncates silently.
 */
/* One shape rule as JSON: {"like":k} | {"scalar":true} | {"blocks_of":k,"attr":a} | {"attr":a} | {"expr":e}. */
static inline void cuplug_shape_rule_json(cuplug_text* t, int rule, int arg, const char* attr) {
    if (rule == CUPLUG_SHAPE_EXPR) {
        cuplug_text_printf(t, "{\"expr\":");
        cuplug_text_json_string(t, attr);
        cuplug_text_printf(t, "}");
    } else if (rule == CUPLUG_SHAPE_SCALAR) {
        cuplug_text_printf(t, "{\"scalar\":true}");
    } else if (rule == CUPLUG_SHAPE_BLOCKS || rule == CUPLUG_SHAPE_ATTR) {
        if (rule == CUPLUG_SHAPE_BLOCKS)
            cuplug_text_printf(t, "{\"blocks_of\":%d,\"attr\":", arg);
        else
            cuplug_text_printf(t, "{\"attr\":");
        cuplug_text_json_string(t, attr);
        cuplug_text_printf(t, "}");
    } else {
        cuplug_text_printf(t, "{\"like\":%d}", arg);
    }
}

static inline int cuplug_ops_json(const cuplug_op* ops, int count, char* buf, size_t len) {
    cuplug_text t = {buf, len, 0};
    if (buf != NULL && len > 0) buf[0] = '\0';
    cuplug_text_printf(&t, "{");
    for (int i = 0; i < count; ++i) {
        const cuplug_op* op = &ops[i];
        if (i) cuplug_text_printf(&t, ",");
        cuplug_text_json_string(&t, op->name);
        cuplug_text_printf(&t, ":{\"inputs\":[");
        for (int k = 0; k < cuplug_op_n_inputs(op); ++k) {
            const cuplug_input_spec* in = &op->inputs[k];
            cuplug_text_printf(&t, "%s{\"name\":", k ? "," : "");
            cuplug_text_json_string(&t, in->name);
            if (in->like > 0) {
                cuplug_text_printf(&t, ",\"like\":%d}", in->like - 1);
            } else {
                cuplug_text_printf(&t, ",\"dtypes\":[");
                int first = 1;
                for (int d = 0; d < CUPLUG_DTYPE_COUNT; ++d)
                    if (in->dtypes & cuplug_dtypes[d].bit) {
                        cuplug_text_printf(&t, "%s\"%s\"", first ? "" : ",", cuplug_dtypes[d].name);
                        first = 0;
                    }
                cuplug_text_printf(&t, "]");
                if (in->shape_rule) {
                    cuplug_text_printf(&t, ",\"shape\":");
                    cuplug_shape_rule_json(&t, in->shape_rule, in->shape_arg, in->shape_attr);
                }
                cuplug_text_printf(&t, "}");
            }
        }
        cuplug_text_printf(&t, "],\"outputs\":[");
        for (int k = 0; k < cuplug_op_n_outputs(op); ++k) {
            const cuplug_output_spec* o = &op->outputs[k];
            cuplug_text_printf(&t, "%s{\"name\":", k ? "," : "");
            cuplug_text_json_string(&t, o->name);
            cuplug_text_printf(&t, ",\"dtype\":");
            if (o->dtype_rule == CUPLUG_DT_FIXED) {
                const struct cuplug_dtype_entry* e = cuplug_dtype_entry_of_bit((unsigned)o->dtype_arg);
                cuplug_text_printf(&t, "{\"fixed\":\"%s\"}", e ? e->name : "unknown");
            } else {
                cuplug_text_printf(&t, "{\"%s\":%d}", o->dtype_rule == CUPLUG_DT_ACCUM ? "accum_of" : "like",
                                   o->dtype_arg);
            }
            cuplug_text_printf(&t, ",\"shape\":");
            cuplug_shape_rule_json(&t, o->shape_rule, o->shape_arg, o->shape_attr);
            cuplug_text_printf(&t, "}");
        }
        cuplug_text_printf(&t, "],\"attrs\":[");
        for (int k = 0; k < cuplug_op_n_attrs(op); ++k) {
            const cuplug_attr_spec* a = &op->attrs[k];
            cuplug_text_printf(&t, "%s{\"name\":", k ? "," : "");
            cuplug_text_json_string(&t, a->name);
            if (a->kind == CUPLUG_ATTR_INT64) {
                cuplug_text_printf(&t, ",\"kind\":\"int64\",\"default\":%lld}", cuplug_int_default(a->def));
            } else {
                cuplug_text_printf(&t, ",\"kind\":\"float64\",\"default\":");
                cuplug_text_json_double(&t, a->def);
                cuplug_text_printf(&t, "}");
            }
        }
        cuplug_text_printf(&t, "],\"size_rules\":[");
        for (int k = 0; k < cuplug_op_n_size_rules(op); ++k) {
            const cuplug_size_rule* r = &op->sizes[k];
            cuplug_text_printf(&t, "%s{\"input\":%d,\"multiple_of\":%lld,\"min\":%lld,\"max\":", k ? "," : "",
                               r->input, r->multiple_of, r->min);
            if (r->max > 0)
                cuplug_text_printf(&t, "%lld}", r->max);
            else
                cuplug_text_printf(&t, "null}");
        }
        cuplug_text_printf(&t, "],\"elementwise\":%s,\"sample_n\":%lld}",
                           (op->flags & CUPLUG_ELEMENTWISE) ? "true" : "false", cuplug_op_sample_n(op));
    }
    cuplug_text_printf(&t, "}");
    if (buf != NULL && len > 0 && t.used >= len) buf[len - 1] = '\0';
    return t.used > 0x7fffffff ? 0x7fffffff : (int)t.used;
}

/* "add, scale_add or sum" into (buf, len), truncated to fit; returns the length needed. */
static inline int cuplug_op_names(const cuplug_op* ops, int count, char* buf, size_t len) {
    cuplug_text t = {buf, len, 0};
    if (buf != NULL && len > 0) buf[0] = '\0';
    for (int i = 0; i < count; ++i)
        cuplug_text_printf(&t, "%s%s", i == 0 ? "" : (i == count - 1 ? " or " : ", "), ops[i].name);
    if (buf != NULL && len > 0 && t.used >= len) buf[len - 1] = '\0';
    return (int)t.used;
}

/* ---- the call check ------------------------------------------------------------------ */

/* "float16, bfloat16 or int8": the dtypes of a mask. */
static inline const char* cuplug_dtype_mask_text(unsigned mask, char* buf, size_t len) {
    cuplug_text t = {buf, len, 0};
    int total = 0, seen = 0;
    if (len > 0) buf[0] = '\0';
    for (int d = 0; d < CUPLUG_DTYPE_COUNT; ++d) total += (mask & cuplug_dtypes[d].bit) != 0;
    for (int d = 0; d < CUPLUG_DTYPE_COUNT; ++d)
        if (mask & cuplug_dtypes[d].bit) {
            cuplug_text_printf(&t, "%s%s", seen == 0 ? "" : (seen == total - 1 ? " or " : ", "), cuplug_dtypes[d].name);
            ++seen;
        }
    if (total == 0) cuplug_text_printf(&t, "(none)");
    return buf;
}

/* A dtype's name, or "{code=5, bits=64, lanes=1}" for one cuplug does not know. */
static inline const char* cuplug_dtype_text(cuplug_dtype d, char* buf, size_t len) {
    if (cuplug_dtype_bit(d) != 0)
        snprintf(buf, len, "%s", cuplug_dtype_name(d));
    else
        snprintf(buf, len, "{code=%u, bits=%u, lanes=%u}", (unsigned)d.code, (unsigned)d.bits, (unsigned)d.lanes);
    return buf;
}

static inline int cuplug_same_shape(const cuplug_tensor* a, const cuplug_tensor* b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; ++i)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* One tensor on its own: pointers, ndim, extents, dtype known, size, C-contiguity. */
static inline int cuplug_check_tensor(const char* opname, const char* what, const cuplug_tensor* t,
                                      long long* numel, char* err, size_t err_len) {
    /* The label ("op: operand") is written only when an error is: formatting it on every call cost the host
     * ~0.1 us per tensor (perf on the CPU twin: snprintf was the top symbol of a 1-element run()). */
    char label[160], s1[256], s2[256];
#define CUPLUG_LABEL (snprintf(label, sizeof label, "%s: %s", opname, what), label)
    int itemsize = cuplug_dtype_size(t->dtype);
    if (itemsize == 0)
        return cuplug_errorf(err, err_len, "%s has dtype %s, which cuplug does not support", CUPLUG_LABEL,
                             cuplug_dtype_text(t->dtype, s1, sizeof s1));
    long long n = 0, nbytes = 0;
    int rc = cuplug_check_shape("", t->ndim, t->shape, itemsize, &n, &nbytes, s1, sizeof s1);
    if (rc != CUPLUG_OK) /* again, to word the error with the label */
        return cuplug_check_shape(CUPLUG_LABEL, t->ndim, t->shape, itemsize, &n, &nbytes, err, err_len);
    if (t->data == NULL && n > 0) return cuplug_errorf(err, err_len, "%s has a NULL data pointer", CUPLUG_LABEL);
    /* data + byte_offset + nbytes must not wrap: a producer's offset near 2^64 is no address. */
    if (n > 0 && ((uintptr_t)t->byte_offset > UINTPTR_MAX - (uintptr_t)t->data ||
                  (uintptr_t)nbytes > UINTPTR_MAX - ((uintptr_t)t->data + (uintptr_t)t->byte_offset)))
        return cuplug_errorf(err, err_len, "%s: data + byte_offset (%p + %llu) and its %lld bytes run past the end of "
                             "the address space", CUPLUG_LABEL, t->data, (unsigned long long)t->byte_offset, nbytes);
    /* Misaligned elements would be undefined behaviour on the host and a sticky
     * cudaErrorMisalignedAddress on a GPU: refused here, for every device. */
    if (n > 0 && ((uintptr_t)t->data + (uintptr_t)t->byte_offset) % (uintptr_t)itemsize != 0)
        return cuplug_errorf(err, err_len, "%s: data + byte_offset (%p + %llu) is not aligned to its %d-byte elements",
                             CUPLUG_LABEL, t->data, (unsigned long long)t->byte_offset, itemsize);
    if (t->strides != NULL && n > 0) {
        long long expect = 1;
        for (int i = t->ndim - 1; i >= 0; --i) {
            if (t->shape[i] != 1 && t->strides[i] != expect) {
                cuplug_shape_text(t->ndim, t->shape, s1, sizeof s1);
                cuplug_shape_text(t->ndim, t->strides, s2, sizeof s2);
                return cuplug_errorf(err, err_len,
                                     "%s is not C-contiguous (shape %s, strides %s); pass a contiguous tensor "
                                     "(.contiguous() / np.ascontiguousarray)",
                                     CUPLUG_LABEL, s1, s2);
            }
            expect *= t->shape[i];
        }
    }
    *numel = n;
    return CUPLUG_OK;
#undef CUPLUG_LABEL
}

/* "alpha, beta" or "no attributes": the attribute names of an op. */
static inline const char* cuplug_attr_names(const cuplug_op* op, char* buf, size_t len) {
    cuplug_text t = {buf, len, 0};
    if (len > 0) buf[0] = '\0';
    int n = cuplug_op_n_attrs(op);
    if (n == 0) cuplug_text_printf(&t, "no attributes");
    for (int k = 0; k < n; ++k) cuplug_text_printf(&t, "%s%s", k ? ", " : "", op->attrs[k].name);
    return buf;
}

/* 2^63 as a double: int64 holds exactly the integral doubles in [-2^63, 2^63). */
#define CUPLUG_TWO_POW_63 9223372036854775808.0

/* Attributes by name into `normalized` (op->attrs order, defaults filled, kind as declared). */
static inline int cuplug_normalize_attrs(const cuplug_op* op, const cuplug_attr* attrs, int n_attrs,
                                         cuplug_attr* normalized, char* err, size_t err_len) {
    char names[512];
    int n_spec = cuplug_op_n_attrs(op);
    int given[CUPLUG_MAX_ARGS] = {0};
    if (n_attrs < 0) return cuplug_errorf(err, err_len, "%s: n_attrs is negative (%d)", op->name, n_attrs);
    if (n_attrs > 0 && attrs == NULL)
        return cuplug_errorf(err, err_len, "%s: NULL attrs with n_attrs %d", op->name, n_attrs);
    for (int k = 0; k < n_spec; ++k) {
        normalized[k].name = op->attrs[k].name;
        normalized[k].kind = op->attrs[k].kind;
        if (op->attrs[k].kind == CUPLUG_ATTR_INT64)
            normalized[k].value.i = (int64_t)cuplug_int_default(op->attrs[k].def);
        else
            normalized[k].value.f = op->attrs[k].def;
    }
    for (int j = 0; j < n_attrs; ++j) {
        const cuplug_attr* a = &attrs[j];
        if (a->name == NULL) return cuplug_errorf(err, err_len, "%s: attribute %d has a NULL name", op->name, j);
        int k = 0;
        while (k < n_spec && strcmp(op->attrs[k].name, a->name) != 0) ++k;
        if (k == n_spec)
            return cuplug_errorf(err, err_len, "%s: unknown attribute '%s' (%s takes %s)", op->name, a->name, op->name,
                                 cuplug_attr_names(op, names, sizeof names));
        if (given[k]) return cuplug_errorf(err, err_len, "%s: attribute '%s' given twice", op->name, a->name);
        given[k] = 1;
        if (a->kind != CUPLUG_ATTR_INT64 && a->kind != CUPLUG_ATTR_FLOAT64)
            return cuplug_errorf(err, err_len, "%s: attribute '%s' has kind %d (0: int64, 1: float64)", op->name,
                                 a->name, (int)a->kind);
        if (op->attrs[k].kind == CUPLUG_ATTR_INT64) {
            if (a->kind == CUPLUG_ATTR_INT64) {
                normalized[k].value.i = a->value.i;
            } else {
                double f = a->value.f;
                if (!(f >= -CUPLUG_TWO_POW_63 && f < CUPLUG_TWO_POW_63) || f != floor(f))
                    return cuplug_errorf(err, err_len, "%s: attribute '%s' is an int64, got the non-integral %.17g",
                                         op->name, a->name, f);
                normalized[k].value.i = (int64_t)f;
            }
        } else {
            normalized[k].value.f = a->kind == CUPLUG_ATTR_FLOAT64 ? a->value.f : (double)a->value.i;
        }
    }
    return CUPLUG_OK;
}

/* The value of normalized attribute `name` as int64 (the op declared it; kinds converted). */
static inline int cuplug_normalized_int(const cuplug_op* op, const cuplug_attr* normalized, const char* name,
                                        long long* value) {
    for (int k = 0; k < cuplug_op_n_attrs(op); ++k)
        if (name != NULL && strcmp(op->attrs[k].name, name) == 0) {
            const cuplug_attr* a = &normalized[k];
            *value = a->kind == CUPLUG_ATTR_INT64 ? (long long)a->value.i : (long long)a->value.f;
            return 1;
        }
    return 0;
}

/* A literal of a shape expression: [-]digits (at most 18), advancing *p; 0 when there is none. */
static inline int cuplug_expr_int(const char** p, const char* end, long long* v) {
    const char* q = *p;
    int neg = q < end && *q == '-';
    q += neg;
    int digits = 0;
    long long n = 0;
    while (q < end && *q >= '0' && *q <= '9' && digits < 19) n = n * 10 + (*q++ - '0'), ++digits;
    if (digits == 0 || digits > 18) return 0;
    *v = neg ? -n : n;
    *p = q;
    return 1;
}

/* The shape a shape expression gives (grammar: loader/cuplug/contract/shapeexpr.py), from inputs [0, n_known)
 * and the normalized attributes; the same messages' meaning as Python's. Spaces are ignored. */
static inline int cuplug_shape_expr(const cuplug_op* op, const char* what, const char* expr, const cuplug_tensor* in,
                                    int n_known, const cuplug_attr* normalized, int* ndim, int64_t* shape, char* err,
                                    size_t err_len) {
    char text[256];
    size_t n = 0;
    for (const char* c = expr ? expr : ""; *c; ++c) {
        if (*c == ' ') continue;
        if (n + 1 >= sizeof text) return cuplug_errorf(err, err_len, "%s: %s's shape expression is too long", op->name, what);
        text[n++] = *c;
    }
    text[n] = '\0';
    const char *p = text, *end = text + n;
    if (n >= 2 && text[0] == '(' && text[n - 1] == ')') ++p, --end;
    if (end > p && end[-1] == ',') --end; /* "(n,)" */
    *ndim = 0;
    while (p < end) {
        const char* name = p;
        while (p < end && (*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                           (p > name && *p >= '0' && *p <= '9')))
            ++p;
        size_t len = (size_t)(p - name);
        long long v = 0;
        if (len == 0) { /* a literal */
            if (!cuplug_expr_int(&p, end, &v) || v < 0)
                return cuplug_errorf(err, err_len, "%s: %s's shape expression '%s' is malformed near '%s'", op->name,
                                     what, expr, name);
            if (*ndim >= CUPLUG_MAX_NDIM) goto too_many;
            shape[(*ndim)++] = v;
        } else {
            int k = -1;
            for (int i = 0; i < n_known; ++i)
                if (strlen(op->inputs[i].name) == len && strncmp(op->inputs[i].name, name, len) == 0) k = i;
            if (p < end && *p == '[') {
                if (k < 0)
                    return cuplug_errorf(err, err_len, "%s: %s's shape expression '%s' names no input '%.*s' before it",
                                         op->name, what, expr, (int)len, name);
                ++p;
                long long a = 0, b = in[k].ndim;
                int has_a = cuplug_expr_int(&p, end, &a), slice = p < end && *p == ':';
                if (slice) {
                    ++p;
                    if (!cuplug_expr_int(&p, end, &b)) b = in[k].ndim;
                    if (!has_a) a = 0;
                }
                if (p >= end || *p != ']' || (!slice && !has_a))
                    return cuplug_errorf(err, err_len, "%s: %s's shape expression '%s' is malformed near '%.*s'",
                                         op->name, what, expr, (int)len, name);
                ++p;
                const long long nd = in[k].ndim;
                if (!slice) {
                    if (a < -nd || a >= nd)
                        return cuplug_errorf(err, err_len,
                                             "%s: shape '%s': %s has %lld dimension(s), so it has no dimension %lld",
                                             op->name, expr, op->inputs[k].name, nd, a);
                    if (*ndim >= CUPLUG_MAX_NDIM) goto too_many;
                    shape[(*ndim)++] = in[k].shape[a < 0 ? a + nd : a];
                } else { /* Python's slice of the dimensions: ends clamped */
                    if (a < 0) a = a + nd < 0 ? 0 : a + nd;
                    if (b < 0) b = b + nd < 0 ? 0 : b + nd;
                    if (a > nd) a = nd;
                    if (b > nd) b = nd;
                    for (long long d = a; d < b; ++d) {
                        if (*ndim >= CUPLUG_MAX_NDIM) goto too_many;
                        shape[(*ndim)++] = in[k].shape[d];
                    }
                }
            } else {
                char attr[128];
                if (k >= 0 || len >= sizeof attr)
                    return cuplug_errorf(err, err_len, "%s: %s's shape expression '%s': '%.*s' needs a dimension",
                                         op->name, what, expr, (int)len, name);
                memcpy(attr, name, len), attr[len] = '\0';
                if (!cuplug_normalized_int(op, normalized, attr, &v))
                    return cuplug_errorf(err, err_len, "%s: %s's shape expression '%s' names attribute '%s', which %s lacks",
                                         op->name, what, expr, attr, op->name);
                if (v < 0)
                    return cuplug_errorf(err, err_len, "%s: shape '%s': attribute %s sizes a shape, so it must be >= 0, got %lld",
                                         op->name, expr, attr, v);
                if (*ndim >= CUPLUG_MAX_NDIM) goto too_many;
                shape[(*ndim)++] = v;
            }
        }
        if (p < end) {
            if (*p != ',' || p + 1 >= end)
                return cuplug_errorf(err, err_len, "%s: %s's shape expression '%s' is malformed near '%s'", op->name,
                                     what, expr, p);
            ++p;
        }
    }
    return CUPLUG_OK;
too_many:
    return cuplug_errorf(err, err_len, "%s: shape '%s' would have more than %d dimensions", op->name, expr,
                         CUPLUG_MAX_NDIM);
}

/*
 * What output k of `op` must be, given checked inputs and normalized attributes:
 * its dtype and shape (*ndim extents into shape[CUPLUG_MAX_NDIM]). Used by the
 * check below and by a framework that allocates outputs itself.
 */
/* The shape a rule gives (like / scalar / blocks_of / attr), from inputs [0, n_known) and the
 * normalized attributes: shared by inputs with a shape rule and by outputs. */
static inline int cuplug_rule_shape(const cuplug_op* op, const char* what, int rule, int arg, const char* attr,
                                    const cuplug_tensor* in, int n_known, const cuplug_attr* normalized, int* ndim,
                                    int64_t* shape, char* err, size_t err_len) {
    long long v = 0;
    if (rule == CUPLUG_SHAPE_SCALAR) {
        *ndim = 0;
        return CUPLUG_OK;
    }
    if (rule == CUPLUG_SHAPE_EXPR)
        return cuplug_shape_expr(op, what, attr, in, n_known, normalized, ndim, shape, err, err_len);
    if (rule == CUPLUG_SHAPE_BLOCKS || rule == CUPLUG_SHAPE_ATTR) {
        if (!cuplug_normalized_int(op, normalized, attr, &v))
            return cuplug_errorf(err, err_len, "%s: %s's shape names attribute '%s', which %s lacks", op->name, what,
                                 attr ? attr : "(null)", op->name);
        if (rule == CUPLUG_SHAPE_ATTR) {
            if (v < 0)
                return cuplug_errorf(err, err_len, "%s: attribute '%s' must be >= 0, got %lld", op->name, attr, v);
            *ndim = 1, shape[0] = v;
            return CUPLUG_OK;
        }
        if (v <= 0)
            return cuplug_errorf(err, err_len, "%s: attribute '%s' must be positive, got %lld", op->name, attr, v);
    }
    if (arg < 0 || arg >= n_known)
        return cuplug_errorf(err, err_len, "%s: %s's shape refers to input %d of %d", op->name, what, arg, n_known);
    if (rule == CUPLUG_SHAPE_BLOCKS) {
        long long n = cuplug_numel(&in[arg]);
        *ndim = 1, shape[0] = n / v + (n % v != 0);
        return CUPLUG_OK;
    }
    *ndim = in[arg].ndim;
    for (int d = 0; d < in[arg].ndim; ++d) shape[d] = in[arg].shape[d];
    return CUPLUG_OK;
}

static inline int cuplug_expected_output(const cuplug_op* op, int k, const cuplug_tensor* in, int n_in,
                                         const cuplug_attr* normalized, cuplug_dtype* dtype, int* ndim,
                                         int64_t* shape, char* err, size_t err_len) {
    const cuplug_output_spec* o = &op->outputs[k];
    if (o->dtype_rule == CUPLUG_DT_FIXED) {
        const struct cuplug_dtype_entry* e = cuplug_dtype_entry_of_bit((unsigned)o->dtype_arg);
        if (e == NULL)
            return cuplug_errorf(err, err_len, "%s: output %s has a fixed dtype bit 0x%x cuplug does not know",
                                 op->name, o->name, (unsigned)o->dtype_arg);
        *dtype = e->dtype;
    } else {
        if (o->dtype_arg < 0 || o->dtype_arg >= n_in)
            return cuplug_errorf(err, err_len, "%s: output %s's dtype refers to input %d of %d", op->name, o->name,
                                 o->dtype_arg, n_in);
        *dtype = in[o->dtype_arg].dtype;
        if (o->dtype_rule == CUPLUG_DT_ACCUM && !(cuplug_dtype_bit(*dtype) & CUPLUG_FLOATS)) { /* integers, bool: int64 */
            cuplug_dtype i64 = {CUPLUG_DTYPE_INT, 64, 1};
            *dtype = i64;
        }
    }
    char what[96], scratch[64];
    int rc = cuplug_rule_shape(op, o->name, o->shape_rule, o->shape_arg, o->shape_attr, in, n_in, normalized, ndim,
                               shape, scratch, sizeof scratch);
    if (rc == CUPLUG_OK) return rc;
    snprintf(what, sizeof what, "output %s", o->name); /* only to word an error (see cuplug_check_tensor) */
    return cuplug_rule_shape(op, what, o->shape_rule, o->shape_arg, o->shape_attr, in, n_in, normalized, ndim, shape,
                             err, err_len);
}

/*
 * Validates one call against op's signature, before any work:
 *  - n_in / n_out match the op's inputs / outputs; no NULL array or tensor pointer
 *    (a data pointer may be NULL only for a tensor of 0 elements);
 *  - every tensor: dtype known (lanes 1), ndim 0..32, extents >= 0, numel * itemsize
 *    fits int64, C-contiguous (strides NULL or the C-contiguous ones; extents of 1
 *    and tensors of 0 elements ignored), data + byte_offset aligned to the itemsize;
 *  - inputs: dtype in the input's mask, or equal in dtype and shape to input k (like);
 *  - attributes by name: unknown names and duplicates refused; an int64 attribute
 *    given as float64 must be integral (it is converted), a float64 one given as
 *    int64 is converted; `normalized` (CUPLUG_MAX_ARGS entries) gets one entry per
 *    op->attrs in that order, defaults filled, kind as declared;
 *  - size rules (multiple_of / min / max on the numel of input k);
 *  - outputs: dtype (like / fixed / accum_of) and shape (like / scalar / blocks_of /
 *    attr) exactly as the rules give.
 * Returns CUPLUG_OK, or CUPLUG_E_INVALID_ARGUMENT with a message naming the op,
 * the operand and what was expected in (err, err_len).
 */
static inline int cuplug_check_call(const cuplug_op* op, const cuplug_tensor* in, int n_in, const cuplug_tensor* out,
                                    int n_out, const cuplug_attr* attrs, int n_attrs, cuplug_attr* normalized,
                                    char* err, size_t err_len) {
    char s1[256], s2[256];
    if (err != NULL && err_len > 0) err[0] = '\0';
    if (op == NULL) return cuplug_errorf(err, err_len, "NULL op");
    if (normalized == NULL) return cuplug_errorf(err, err_len, "%s: NULL normalized-attribute array", op->name);
    const int want_in = cuplug_op_n_inputs(op), want_out = cuplug_op_n_outputs(op);
    if (n_in != want_in)
        return cuplug_errorf(err, err_len, "%s: takes %d input%s, got %d", op->name, want_in, want_in == 1 ? "" : "s",
                             n_in);
    if (n_out != want_out)
        return cuplug_errorf(err, err_len, "%s: takes %d output%s, got %d", op->name, want_out,
                             want_out == 1 ? "" : "s", n_out);
    if (n_in > 0 && in == NULL) return cuplug_errorf(err, err_len, "%s: NULL input array", op->name);
    if (n_out > 0 && out == NULL) return cuplug_errorf(err, err_len, "%s: NULL output array", op->name);

    long long numel[CUPLUG_MAX_ARGS];
    for (int k = 0; k < n_in; ++k) {
        const cuplug_input_spec* spec = &op->inputs[k];
        int rc = cuplug_check_tensor(op->name, spec->name, &in[k], &numel[k], err, err_len);
        if (rc != CUPLUG_OK) return rc;
        if (spec->like > 0) {
            int j = spec->like - 1;
            if (j < 0 || j >= k)
                return cuplug_errorf(err, err_len, "%s: input %s is declared like input %d, which is not before it",
                                     op->name, spec->name, j);
            unsigned a = cuplug_dtype_bit(in[k].dtype), b = cuplug_dtype_bit(in[j].dtype);
            if (a != b)
                return cuplug_errorf(err, err_len, "%s: %s has dtype %s, must match %s (%s)", op->name, spec->name,
                                     cuplug_dtype_text(in[k].dtype, s1, sizeof s1), op->inputs[j].name,
                                     cuplug_dtype_text(in[j].dtype, s2, sizeof s2));
            if (!cuplug_same_shape(&in[k], &in[j]))
                return cuplug_errorf(err, err_len, "%s: %s has shape %s, must match %s's shape %s", op->name,
                                     spec->name, cuplug_shape_text(in[k].ndim, in[k].shape, s1, sizeof s1),
                                     op->inputs[j].name, cuplug_shape_text(in[j].ndim, in[j].shape, s2, sizeof s2));
        } else if ((cuplug_dtype_bit(in[k].dtype) & spec->dtypes) == 0) {
            return cuplug_errorf(err, err_len, "%s: %s has dtype %s; allowed: %s", op->name, spec->name,
                                 cuplug_dtype_text(in[k].dtype, s1, sizeof s1),
                                 cuplug_dtype_mask_text(spec->dtypes, s2, sizeof s2));
        }
    }

    int rc = cuplug_normalize_attrs(op, attrs, n_attrs, normalized, err, err_len);
    if (rc != CUPLUG_OK) return rc;

    for (int k = 0; k < n_in; ++k) { /* inputs whose shape follows from earlier inputs and attributes */
        const cuplug_input_spec* spec = &op->inputs[k];
        if (!spec->shape_rule) continue;
        int64_t want[CUPLUG_MAX_NDIM];
        int want_ndim = 0;
        rc = cuplug_rule_shape(op, spec->name, spec->shape_rule, spec->shape_arg, spec->shape_attr, in, k,
                               normalized, &want_ndim, want, err, err_len);
        if (rc != CUPLUG_OK) return rc;
        int same = in[k].ndim == want_ndim;
        for (int d = 0; same && d < want_ndim; ++d) same = in[k].shape[d] == want[d];
        if (!same)
            return cuplug_errorf(err, err_len, "%s: %s has shape %s; it must be %s", op->name, spec->name,
                                 cuplug_shape_text(in[k].ndim, in[k].shape, s1, sizeof s1),
                                 cuplug_shape_text(want_ndim, want, s2, sizeof s2));
    }

    for (int r = 0; r < cuplug_op_n_size_rules(op); ++r) {
        const cuplug_size_rule* rule = &op->sizes[r];
        if (rule->input < 0 || rule->input >= n_in)
            return cuplug_errorf(err, err_len, "%s: size rule %d refers to input %d of %d", op->name, r, rule->input,
                                 n_in);
        long long n = numel[rule->input];
        const char* name = op->inputs[rule->input].name;
        if (rule->multiple_of > 0 && n % rule->multiple_of != 0)
            return cuplug_errorf(err, err_len, "%s: %s has %lld elements, must be a multiple of %lld", op->name, name,
                                 n, rule->multiple_of);
        if (rule->min > 0 && n < rule->min)
            return cuplug_errorf(err, err_len, "%s: %s has %lld elements, must be at least %lld", op->name, name, n,
                                 rule->min);
        if (rule->max > 0 && n > rule->max)
            return cuplug_errorf(err, err_len, "%s: %s has %lld elements, must be at most %lld", op->name, name, n,
                                 rule->max);
    }

    for (int k = 0; k < n_out; ++k) {
        const cuplug_output_spec* spec = &op->outputs[k];
        long long n = 0;
        rc = cuplug_check_tensor(op->name, spec->name, &out[k], &n, err, err_len);
        if (rc != CUPLUG_OK) return rc;
        cuplug_dtype dtype = {0, 0, 0};
        int ndim = 0;
        int64_t shape[CUPLUG_MAX_NDIM];
        rc = cuplug_expected_output(op, k, in, n_in, normalized, &dtype, &ndim, shape, err, err_len);
        if (rc != CUPLUG_OK) return rc;
        if (cuplug_dtype_bit(out[k].dtype) != cuplug_dtype_bit(dtype))
            return cuplug_errorf(err, err_len, "%s: %s has dtype %s, expected %s", op->name, spec->name,
                                 cuplug_dtype_text(out[k].dtype, s1, sizeof s1), cuplug_dtype_name(dtype));
        int same = out[k].ndim == ndim;
        for (int i = 0; same && i < ndim; ++i) same = out[k].shape[i] == shape[i];
        if (!same)
            return cuplug_errorf(err, err_len, "%s: %s has shape %s, expected %s", op->name, spec->name,
                                 cuplug_shape_text(out[k].ndim, out[k].shape, s1, sizeof s1),
                                 cuplug_shape_text(ndim, shape, s2, sizeof s2));
    }
    return CUPLUG_OK;
}

#endif /* CUPLUG_SIGNATURE_H */
