/*
 * The CPU twin of the reference "vector" backend: the same C ABI in plain C,
 * so every caller treats a CPU fallback exactly like a CUDA variant.
 */
#include <pthread.h>

#include "cuplug_common.h"

struct cuplug_backend {
    pthread_mutex_t lock; /* serializes calls on one instance */
    cuplug_buffer_table buffers;
    char last_error[CUPLUG_ERR_LEN];
};

static pthread_mutex_t g_serial_lock = PTHREAD_MUTEX_INITIALIZER;
static long long g_next_serial = 1;
static __thread char g_create_error[CUPLUG_ERR_LEN];

static int fail(cuplug_backend* h, int code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cuplug_vformat(h->last_error, fmt, ap);
    va_end(ap);
    return code;
}

CUPLUG_API int cuplug_backend_abi_version(void) { return CUPLUG_BACKEND_ABI_VERSION; }

CUPLUG_API cuplug_backend* cuplug_backend_create(const char* device_pref) {
    if (device_pref != NULL && device_pref[0] != '\0' && strcmp(device_pref, "auto") != 0 &&
        strcmp(device_pref, "0") != 0 && strcmp(device_pref, "cpu") != 0) {
        snprintf(g_create_error, CUPLUG_ERR_LEN,
                 "cpu backend has one device (0); got device_pref '%s'", device_pref);
        return NULL;
    }
    cuplug_backend* h = (cuplug_backend*)calloc(1, sizeof(*h));
    if (h == NULL) {
        snprintf(g_create_error, CUPLUG_ERR_LEN, "out of host memory creating the cpu backend");
        return NULL;
    }
    pthread_mutex_init(&h->lock, NULL);
    pthread_mutex_lock(&g_serial_lock);
    h->buffers.serial = g_next_serial++;
    pthread_mutex_unlock(&g_serial_lock);
    g_create_error[0] = '\0';
    return h;
}

CUPLUG_API int cuplug_backend_last_create_error(char* buf, int len) {
    return cuplug_write_text(g_create_error, buf, len);
}

CUPLUG_API int cuplug_backend_last_error(cuplug_backend* h, char* buf, int len) {
    if (h == NULL) return cuplug_write_text("NULL backend handle", buf, len);
    pthread_mutex_lock(&h->lock);
    int need = cuplug_write_text(h->last_error, buf, len);
    pthread_mutex_unlock(&h->lock);
    return need;
}

CUPLUG_API int cuplug_backend_ping(cuplug_backend* h, char* buf, int len) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    static const char info[] =
        "{\"backend\":\"vector\",\"variant\":\"cpu\",\"abi\":1,"
        "\"driver_version\":null,\"runtime_version\":null,"
        "\"device\":{\"index\":0,\"name\":\"cpu\",\"capability\":null,"
        "\"memory_free\":null,\"memory_total\":null,\"temperature_c\":null},"
        "\"sass\":\"\",\"ptx\":\"\"}";
    return cuplug_write_text(info, buf, len);
}

/* float64 accumulation in four independent lanes: exact enough for 1e8+ elements
 * (error ~ n * 2^-53) and fast, as the lanes break the add dependency chain. */
static double sum_f64(const float* x, long long n) {
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    long long i = 0;
    for (; i + 4 <= n; i += 4) {
        a0 += x[i];
        a1 += x[i + 1];
        a2 += x[i + 2];
        a3 += x[i + 3];
    }
    for (; i < n; ++i) a0 += x[i];
    return (a0 + a1) + (a2 + a3);
}

static void apply(int op, const float* x, const float* y, float alpha, float beta, float* out,
                  long long n) {
    switch (op) {
        case CUPLUG_OP_ADD:
            for (long long i = 0; i < n; ++i) out[i] = x[i] + y[i];
            break;
        case CUPLUG_OP_SCALE_ADD:
            for (long long i = 0; i < n; ++i) out[i] = alpha * x[i] + beta;
            break;
        default:
            out[0] = (float)sum_f64(x, n);
            break;
    }
}

static int check_op_args(cuplug_backend* h, const char* op, long long n, int* op_code) {
    *op_code = cuplug_parse_op(op);
    if (*op_code < 0)
        return fail(h, CUPLUG_E_UNKNOWN_OP, "unknown op '%s' (expected add, scale_add or sum)",
                    op ? op : "(null)");
    if (n <= 0 || n > CUPLUG_MAX_ELEMENTS)
        return fail(h, CUPLUG_E_INVALID_ARGUMENT, "n must be in 1..%lld, got %lld",
                    CUPLUG_MAX_ELEMENTS, n);
    return CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_run(cuplug_backend* h, const char* op, const float* x,
                                  const float* y, float alpha, float beta, float* out,
                                  long long n) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int op_code;
    int rc = check_op_args(h, op, n, &op_code);
    if (rc == CUPLUG_OK) {
        if (x == NULL || out == NULL || (op_code == CUPLUG_OP_ADD && y == NULL))
            rc = fail(h, CUPLUG_E_INVALID_ARGUMENT, "%s: NULL input or output pointer", op);
        else
            apply(op_code, x, y, alpha, beta, out, n);
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, long long n) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    long long rc;
    if (n <= 0 || n > CUPLUG_MAX_ELEMENTS) {
        rc = fail(h, CUPLUG_E_INVALID_ARGUMENT, "alloc: n must be in 1..%lld, got %lld",
                  CUPLUG_MAX_ELEMENTS, n);
    } else {
        float* p = (float*)malloc((size_t)n * sizeof(float));
        if (p == NULL) {
            rc = fail(h, CUPLUG_E_OUT_OF_MEMORY, "alloc: out of memory for %lld floats", n);
        } else {
            rc = cuplug_table_add(&h->buffers, p, n);
            if (rc < 0) {
                free(p);
                fail(h, (int)rc, "alloc: buffer table full");
            }
        }
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* Looks up id and checks it holds at least n elements; sets the error otherwise. */
static cuplug_buffer* buffer_for(cuplug_backend* h, long long id, long long n, const char* what,
                                 int* rc) {
    cuplug_buffer* b = cuplug_table_get(&h->buffers, id);
    if (b == NULL) {
        *rc = fail(h, CUPLUG_E_BAD_BUFFER, "%s: buffer id %lld is not a live buffer of this instance",
                   what, id);
    } else if (n <= 0 || n > b->n) {
        *rc = fail(h, n <= 0 ? CUPLUG_E_INVALID_ARGUMENT : CUPLUG_E_BUFFER_TOO_SMALL,
                   "%s: n=%lld does not fit buffer %lld of %lld elements", what, n, id, b->n);
        b = NULL;
    }
    return b;
}

/* Copies n floats between a host array and buffer id, in the direction to_host says. */
static int copy_buffer(cuplug_backend* h, long long id, void* host, long long n, int to_host,
                       const char* what) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = CUPLUG_OK;
    cuplug_buffer* b = buffer_for(h, id, n, what, &rc);
    if (b != NULL && host == NULL) {
        rc = fail(h, CUPLUG_E_INVALID_ARGUMENT, "%s: NULL host pointer", what);
    } else if (b != NULL) {
        size_t bytes = (size_t)n * sizeof(float);
        if (to_host)
            memcpy(host, b->ptr, bytes);
        else
            memcpy(b->ptr, host, bytes);
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id, const float* host,
                                     long long n) {
    return copy_buffer(h, id, (void*)host, n, 0, "upload");
}

CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id, float* host, long long n) {
    return copy_buffer(h, id, host, n, 1, "download");
}

CUPLUG_API int cuplug_backend_run_resident(cuplug_backend* h, const char* op, long long in_id,
                                           long long in2_id, long long out_id, float alpha,
                                           float beta, long long n) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int op_code;
    int rc = check_op_args(h, op, n, &op_code);
    cuplug_buffer *x = NULL, *y = NULL, *out = NULL;
    if (rc == CUPLUG_OK) x = buffer_for(h, in_id, n, "input", &rc);
    if (rc == CUPLUG_OK && op_code == CUPLUG_OP_ADD) y = buffer_for(h, in2_id, n, "input2", &rc);
    if (rc == CUPLUG_OK)
        out = buffer_for(h, out_id, op_code == CUPLUG_OP_SUM ? 1 : n, "output", &rc);
    if (rc == CUPLUG_OK)
        apply(op_code, (const float*)x->ptr, y ? (const float*)y->ptr : NULL, alpha, beta,
              (float*)out->ptr, n);
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API int cuplug_backend_sync(cuplug_backend* h) {
    return h == NULL ? CUPLUG_E_INVALID_ARGUMENT : CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_free(cuplug_backend* h, long long id) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = CUPLUG_OK;
    cuplug_buffer* b = cuplug_table_get(&h->buffers, id);
    if (b == NULL) {
        rc = fail(h, CUPLUG_E_BAD_BUFFER, "free: buffer id %lld is not a live buffer of this instance",
                  id);
    } else {
        free(b->ptr);
        b->ptr = NULL;
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API void cuplug_backend_destroy(cuplug_backend* h) {
    if (h == NULL) return;
    for (long long i = 0; i < h->buffers.count; ++i) free(h->buffers.slots[i].ptr);
    free(h->buffers.slots);
    pthread_mutex_destroy(&h->lock);
    free(h);
}
