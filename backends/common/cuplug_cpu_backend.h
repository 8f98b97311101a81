/*
 * The whole C ABI of a CPU backend around a table `cuplug_ops` (see cuplug_ops.h).
 * Include it once, at the end of the backend's .c file, after the table:
 * every caller then treats the CPU twin exactly like a CUDA variant.
 */
#ifndef CUPLUG_CPU_BACKEND_H
#define CUPLUG_CPU_BACKEND_H

#include <pthread.h>

#include "cuplug_common.h"
#include "cuplug_ops.h"

#define CUPLUG_CPU_OP_COUNT CUPLUG_OP_COUNT(cuplug_ops)

struct cuplug_backend {
    pthread_mutex_t lock; /* serializes calls on one instance */
    cuplug_buffer_table buffers;
    char last_error[CUPLUG_ERR_LEN];
};

static pthread_mutex_t cuplug_cpu_serial_lock = PTHREAD_MUTEX_INITIALIZER;
static long long cuplug_cpu_next_serial = 1;
static __thread char cuplug_cpu_create_error[CUPLUG_ERR_LEN];

static int cuplug_cpu_fail(cuplug_backend* h, int code, const char* fmt, ...) {
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
        snprintf(cuplug_cpu_create_error, CUPLUG_ERR_LEN,
                 "cpu backend has one device (0); got device_pref '%s'", device_pref);
        return NULL;
    }
    cuplug_backend* h = (cuplug_backend*)calloc(1, sizeof(*h));
    if (h == NULL) {
        snprintf(cuplug_cpu_create_error, CUPLUG_ERR_LEN, "out of host memory creating the cpu backend");
        return NULL;
    }
    pthread_mutex_init(&h->lock, NULL);
    pthread_mutex_lock(&cuplug_cpu_serial_lock);
    h->buffers.serial = cuplug_cpu_next_serial++;
    pthread_mutex_unlock(&cuplug_cpu_serial_lock);
    cuplug_cpu_create_error[0] = '\0';
    return h;
}

CUPLUG_API int cuplug_backend_last_create_error(char* buf, int len) {
    return cuplug_write_text(cuplug_cpu_create_error, buf, len);
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
    char ops[1024], info[1536];
    cuplug_ops_json(cuplug_ops, CUPLUG_CPU_OP_COUNT, ops, sizeof ops);
    snprintf(info, sizeof info,
             "{\"backend\":\"%s\",\"variant\":\"cpu\",\"abi\":%d,"
             "\"driver_version\":null,\"runtime_version\":null,"
             "\"device\":{\"index\":0,\"name\":\"cpu\",\"capability\":null,"
             "\"memory_free\":null,\"memory_total\":null,\"temperature_c\":null},"
             "\"sass\":\"\",\"ptx\":\"\",\"ops\":%s}",
             CUPLUG_BACKEND_NAME, CUPLUG_BACKEND_ABI_VERSION, ops);
    return cuplug_write_text(info, buf, len);
}

static const cuplug_op* cuplug_cpu_check_op(cuplug_backend* h, const char* op, long long n, int* rc) {
    const cuplug_op* found = cuplug_find_op(cuplug_ops, CUPLUG_CPU_OP_COUNT, op);
    if (found == NULL) {
        char names[256];
        cuplug_op_names(cuplug_ops, CUPLUG_CPU_OP_COUNT, names, sizeof names);
        *rc = cuplug_cpu_fail(h, CUPLUG_E_UNKNOWN_OP, "unknown op '%s' (expected %s)", op ? op : "(null)", names);
    } else if (n <= 0 || n > CUPLUG_MAX_ELEMENTS) {
        *rc = cuplug_cpu_fail(h, CUPLUG_E_INVALID_ARGUMENT, "n must be in 1..%lld, got %lld", CUPLUG_MAX_ELEMENTS, n);
        found = NULL;
    }
    return found;
}

static int cuplug_cpu_call(cuplug_backend* h, const cuplug_op* op, const float* x, const float* y, float alpha,
                           float beta, float* out, long long n) {
    cuplug_call call = {x, y, alpha, beta, out, n, NULL, 0, h};
    int rc = op->fn(&call);
    return rc == CUPLUG_OK ? rc : cuplug_cpu_fail(h, rc, "%s failed (status %d)", op->name, rc);
}

CUPLUG_API int cuplug_backend_run(cuplug_backend* h, const char* op, const float* x, const float* y, float alpha,
                                  float beta, float* out, long long n) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = CUPLUG_OK;
    const cuplug_op* found = cuplug_cpu_check_op(h, op, n, &rc);
    if (found != NULL) {
        if (x == NULL || out == NULL || (found->inputs > 1 && y == NULL))
            rc = cuplug_cpu_fail(h, CUPLUG_E_INVALID_ARGUMENT, "%s: NULL input or output pointer", op);
        else
            rc = cuplug_cpu_call(h, found, x, found->inputs > 1 ? y : NULL, alpha, beta, out, n);
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, long long n) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    long long rc;
    if (n <= 0 || n > CUPLUG_MAX_ELEMENTS) {
        rc = cuplug_cpu_fail(h, CUPLUG_E_INVALID_ARGUMENT, "alloc: n must be in 1..%lld, got %lld",
                             CUPLUG_MAX_ELEMENTS, n);
    } else {
        float* p = (float*)malloc((size_t)n * sizeof(float));
        if (p == NULL) {
            rc = cuplug_cpu_fail(h, CUPLUG_E_OUT_OF_MEMORY, "alloc: out of memory for %lld floats", n);
        } else {
            rc = cuplug_table_add(&h->buffers, p, n);
            if (rc < 0) {
                free(p);
                cuplug_cpu_fail(h, (int)rc, "alloc: buffer table full");
            }
        }
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* Looks up id and checks it holds at least n elements; sets the error otherwise. */
static cuplug_buffer* cuplug_cpu_buffer(cuplug_backend* h, long long id, long long n, const char* what, int* rc) {
    cuplug_buffer* b = cuplug_table_get(&h->buffers, id);
    if (b == NULL) {
        *rc = cuplug_cpu_fail(h, CUPLUG_E_BAD_BUFFER, "%s: buffer id %lld is not a live buffer of this instance",
                              what, id);
    } else if (n <= 0 || n > b->n) {
        *rc = cuplug_cpu_fail(h, n <= 0 ? CUPLUG_E_INVALID_ARGUMENT : CUPLUG_E_BUFFER_TOO_SMALL,
                              "%s: n=%lld does not fit buffer %lld of %lld elements", what, n, id, b->n);
        b = NULL;
    }
    return b;
}

/* Copies n floats between a host array and buffer id, in the direction to_host says. */
static int cuplug_cpu_copy(cuplug_backend* h, long long id, void* host, long long n, int to_host, const char* what) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = CUPLUG_OK;
    cuplug_buffer* b = cuplug_cpu_buffer(h, id, n, what, &rc);
    if (b != NULL && host == NULL) {
        rc = cuplug_cpu_fail(h, CUPLUG_E_INVALID_ARGUMENT, "%s: NULL host pointer", what);
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

CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id, const float* host, long long n) {
    return cuplug_cpu_copy(h, id, (void*)host, n, 0, "upload");
}

CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id, float* host, long long n) {
    return cuplug_cpu_copy(h, id, host, n, 1, "download");
}

CUPLUG_API int cuplug_backend_run_resident(cuplug_backend* h, const char* op, long long in_id, long long in2_id,
                                           long long out_id, float alpha, float beta, long long n) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = CUPLUG_OK;
    const cuplug_op* found = cuplug_cpu_check_op(h, op, n, &rc);
    cuplug_buffer *x = NULL, *y = NULL, *out = NULL;
    if (found != NULL) x = cuplug_cpu_buffer(h, in_id, n, "input", &rc);
    if (rc == CUPLUG_OK && found->inputs > 1) y = cuplug_cpu_buffer(h, in2_id, n, "input2", &rc);
    if (rc == CUPLUG_OK) out = cuplug_cpu_buffer(h, out_id, found->out == CUPLUG_OUT_ONE ? 1 : n, "output", &rc);
    if (rc == CUPLUG_OK)
        rc = cuplug_cpu_call(h, found, (const float*)x->ptr, y ? (const float*)y->ptr : NULL, alpha, beta,
                             (float*)out->ptr, n);
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API int cuplug_backend_sync(cuplug_backend* h) { return h == NULL ? CUPLUG_E_INVALID_ARGUMENT : CUPLUG_OK; }

CUPLUG_API int cuplug_backend_free(cuplug_backend* h, long long id) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = CUPLUG_OK;
    cuplug_buffer* b = cuplug_table_get(&h->buffers, id);
    if (b == NULL) {
        rc = cuplug_cpu_fail(h, CUPLUG_E_BAD_BUFFER, "free: buffer id %lld is not a live buffer of this instance", id);
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

#endif /* CUPLUG_CPU_BACKEND_H */
