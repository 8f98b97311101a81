/*
 * The whole C ABI (v2, cuplug/backend.h) of a CPU backend around a table
 * `cuplug_ops` (see cuplug_ops.h). Include it once, at the end of the backend's
 * .c file, after the table: every caller then treats the CPU twin exactly like
 * a CUDA variant.
 *
 * - Tensors: CPU and CUDA-host (pinned) tensors are accepted; a CUDA device
 *   tensor is refused with CUPLUG_E_WRONG_DEVICE before anything runs.
 * - Every call is checked against the op's signature (cuplug_check_call); ops
 *   see C-contiguous tensors with byte_offset folded into data, and n = numel
 *   of input 0. An elementwise op whose tensors are all empty is not called
 *   (nothing to do); a non-elementwise op is, with n == 0, and writes its
 *   outputs (a sum of nothing is 0).
 * - Streams do not exist here: `stream` arguments are accepted and ignored,
 *   stream_wait() and sync() only validate the handle.
 * - Each instance has a mutex that serializes its calls.
 * - Fork: a pthread_atfork handler (registered once) takes the process-wide
 *   instance-list lock and then every live instance's lock before fork(), so
 *   no instance is mid-call (its table half-updated) when the address space is
 *   copied: fork() waits for calls in progress on other threads to return. The
 *   parent then unlocks them; the child re-initializes them (and the list
 *   lock), so it can use every instance it inherited. glibc drops the handlers
 *   of a library when it is dlclose()d. The generation counter for resident ids
 *   is an atomic, the create error thread-local: no other lock exists.
 */
#ifndef CUPLUG_CPU_BACKEND_H
#define CUPLUG_CPU_BACKEND_H

#include <pthread.h>

#include "cuplug_common.h"
#include "cuplug_ops.h"
#include "cuplug_signature.h"

#define CUPLUG_CPU_OP_COUNT CUPLUG_OP_COUNT(cuplug_ops)
#define CUPLUG_CPU_ALIGN 64

struct cuplug_backend {
    pthread_mutex_t lock; /* serializes calls on one instance */
    cuplug_tensor_table tensors;
    struct cuplug_backend* prev; /* the live-instance list (for the fork handlers) */
    struct cuplug_backend* next;
    char last_error[CUPLUG_ERR_LEN];
};

static pthread_mutex_t cuplug_cpu_list_lock = PTHREAD_MUTEX_INITIALIZER;
static cuplug_backend* cuplug_cpu_instances = NULL;
/* Not pthread_once: that is a GLIBC_2.34 symbol when linked on a new host, and the main wheel's
 * CPU twin must stay manylinux_2_17. The flag is read and set under cuplug_cpu_list_lock. */
static int cuplug_cpu_atfork_registered = 0;
static __thread char cuplug_cpu_create_error[CUPLUG_ERR_LEN];

static void cuplug_cpu_prefork(void) {
    pthread_mutex_lock(&cuplug_cpu_list_lock);
    for (cuplug_backend* h = cuplug_cpu_instances; h != NULL; h = h->next) pthread_mutex_lock(&h->lock);
}
static void cuplug_cpu_postfork_parent(void) {
    for (cuplug_backend* h = cuplug_cpu_instances; h != NULL; h = h->next) pthread_mutex_unlock(&h->lock);
    pthread_mutex_unlock(&cuplug_cpu_list_lock);
}
static void cuplug_cpu_postfork_child(void) {
    for (cuplug_backend* h = cuplug_cpu_instances; h != NULL; h = h->next) pthread_mutex_init(&h->lock, NULL);
    pthread_mutex_init(&cuplug_cpu_list_lock, NULL);
}
static void cuplug_cpu_register_atfork(void) {
    pthread_atfork(cuplug_cpu_prefork, cuplug_cpu_postfork_parent, cuplug_cpu_postfork_child);
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
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
        snprintf(cuplug_cpu_create_error, CUPLUG_ERR_LEN, "cpu backend has one device (0); got device_pref '%s'",
                 device_pref);
        return NULL;
    }
    pthread_mutex_lock(&cuplug_cpu_list_lock);
    if (!cuplug_cpu_atfork_registered) {
        cuplug_cpu_register_atfork();
        cuplug_cpu_atfork_registered = 1;
    }
    pthread_mutex_unlock(&cuplug_cpu_list_lock);
    cuplug_backend* h = (cuplug_backend*)calloc(1, sizeof(*h));
    if (h == NULL) {
        snprintf(cuplug_cpu_create_error, CUPLUG_ERR_LEN, "out of host memory creating the cpu backend");
        return NULL;
    }
    if (pthread_mutex_init(&h->lock, NULL) != 0) {
        free(h);
        snprintf(cuplug_cpu_create_error, CUPLUG_ERR_LEN, "pthread_mutex_init failed creating the cpu backend");
        return NULL;
    }
    pthread_mutex_lock(&cuplug_cpu_list_lock);
    h->next = cuplug_cpu_instances;
    if (cuplug_cpu_instances != NULL) cuplug_cpu_instances->prev = h;
    cuplug_cpu_instances = h;
    pthread_mutex_unlock(&cuplug_cpu_list_lock);
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

/* The ping JSON, built in memory of the size it needs (never truncated), then
 * copied into (buf, len); returns the full length. */
CUPLUG_API int cuplug_backend_ping(cuplug_backend* h, char* buf, int len) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc;
    int ops_len = cuplug_ops_json(cuplug_ops, CUPLUG_CPU_OP_COUNT, NULL, 0);
    char* ops = (char*)malloc((size_t)ops_len + 1);
    if (ops == NULL) {
        rc = cuplug_cpu_fail(h, CUPLUG_E_OUT_OF_MEMORY, "ping: out of host memory for %d bytes of JSON", ops_len);
    } else {
        cuplug_ops_json(cuplug_ops, CUPLUG_CPU_OP_COUNT, ops, (size_t)ops_len + 1);
        cuplug_text t = {NULL, 0, 0};
        char* info = NULL;
        for (int pass = 0; pass < 2; ++pass) { /* pass 0 measures, pass 1 writes */
            t.used = 0;
            cuplug_text_printf(&t, "{\"backend\":");
            cuplug_text_json_string(&t, CUPLUG_BACKEND_NAME);
            cuplug_text_printf(&t,
                               ",\"variant\":\"cpu\",\"abi\":%d,\"driver_version\":null,\"runtime_version\":null,"
                               "\"device\":{\"type\":\"cpu\",\"index\":0,\"name\":\"cpu\",\"capability\":null,"
                               "\"memory_free\":null,\"memory_total\":null,\"temperature_c\":null},"
                               "\"stream\":0,\"sass\":\"\",\"ptx\":\"\",\"ops\":%s}",
                               CUPLUG_BACKEND_ABI_VERSION, ops);
            if (pass == 0) {
                info = (char*)malloc(t.used + 1);
                if (info == NULL) break;
                t.buf = info;
                t.len = t.used + 1;
            }
        }
        if (info == NULL) {
            rc = cuplug_cpu_fail(h, CUPLUG_E_OUT_OF_MEMORY, "ping: out of host memory for the JSON");
        } else {
            rc = cuplug_write_text(info, buf, len);
            free(info);
        }
        free(ops);
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* A device the CPU backend cannot read: anything but CPU and CUDA-host memory. */
static int cuplug_cpu_check_device(cuplug_backend* h, const char* op, const char* what, const cuplug_tensor* t) {
    if (t->device_type == CUPLUG_DEVICE_CPU || t->device_type == CUPLUG_DEVICE_CUDA_HOST) return CUPLUG_OK;
    if (t->device_type == CUPLUG_DEVICE_CUDA)
        return cuplug_cpu_fail(h, CUPLUG_E_WRONG_DEVICE,
                               "%s: %s is a CUDA tensor (device %d), but this is the CPU backend; move the tensor to "
                               "the host (.cpu()) or load a CUDA backend",
                               op, what, (int)t->device_id);
    return cuplug_cpu_fail(h, CUPLUG_E_WRONG_DEVICE,
                           "%s: %s is on device type %d, but this is the CPU backend; it reads host memory only "
                           "(CPU or CUDA-host tensors)",
                           op, what, (int)t->device_type);
}

/* Copies of the tensors with byte_offset folded into data (and strides NULL: checked contiguous). */
static void cuplug_cpu_fold(const cuplug_tensor* src, cuplug_tensor* dst, int n) {
    for (int k = 0; k < n; ++k) {
        dst[k] = src[k];
        if (dst[k].data != NULL) dst[k].data = (char*)dst[k].data + dst[k].byte_offset;
        dst[k].byte_offset = 0;
        dst[k].strides = NULL;
    }
}

static int cuplug_cpu_call_locked(cuplug_backend* h, const char* opname, const cuplug_tensor* in, int n_in,
                                  cuplug_tensor* out, int n_out, const cuplug_attr* attrs, int n_attrs) {
    const cuplug_op* op = cuplug_find_op(cuplug_ops, CUPLUG_CPU_OP_COUNT, opname);
    if (op == NULL) {
        char names[400];
        if (cuplug_op_names(cuplug_ops, CUPLUG_CPU_OP_COUNT, names, sizeof names) < (int)sizeof names)
            return cuplug_cpu_fail(h, CUPLUG_E_UNKNOWN_OP, "unknown op '%.64s' (this backend has %s)",
                                   opname ? opname : "(null)", names);
        return cuplug_cpu_fail(h, CUPLUG_E_UNKNOWN_OP, "unknown op '%.64s' (this backend has %d ops; its ping lists them)",
                               opname ? opname : "(null)", CUPLUG_CPU_OP_COUNT);
    }
    /* The device first (a CUDA tensor is the likeliest mistake), for the tensors the check will look at. */
    if (in != NULL && n_in == cuplug_op_n_inputs(op))
        for (int k = 0; k < n_in; ++k) {
            int rc = cuplug_cpu_check_device(h, op->name, op->inputs[k].name, &in[k]);
            if (rc != CUPLUG_OK) return rc;
        }
    if (out != NULL && n_out == cuplug_op_n_outputs(op))
        for (int k = 0; k < n_out; ++k) {
            int rc = cuplug_cpu_check_device(h, op->name, op->outputs[k].name, &out[k]);
            if (rc != CUPLUG_OK) return rc;
        }
    cuplug_attr normalized[CUPLUG_MAX_ARGS];
    int rc = cuplug_check_call(op, in, n_in, out, n_out, attrs, n_attrs, normalized, h->last_error,
                               sizeof h->last_error);
    if (rc != CUPLUG_OK) return rc;

    cuplug_tensor fin[CUPLUG_MAX_ARGS], fout[CUPLUG_MAX_ARGS];
    cuplug_cpu_fold(in, fin, n_in);
    cuplug_cpu_fold(out, fout, n_out);
    char op_error[CUPLUG_ERR_LEN];
    op_error[0] = '\0';
    cuplug_call call;
    memset(&call, 0, sizeof call);
    call.op = op;
    call.in = fin;
    call.n_in = n_in;
    call.out = fout;
    call.n_out = n_out;
    call.attrs = normalized;
    call.n_attrs = cuplug_op_n_attrs(op);
    call.n = n_in > 0 ? cuplug_numel(&fin[0]) : 0;
    call.stream = NULL;
    call.sm_count = 0;
    call.backend = h;
    call.error = op_error;
    call.error_len = sizeof op_error;
    if (op->flags & CUPLUG_ELEMENTWISE) { /* all empty: nothing to compute */
        long long total = call.n;
        for (int k = 0; k < n_out; ++k) total += cuplug_numel(&fout[k]);
        if (total == 0) return CUPLUG_OK;
    }
    rc = op->fn(&call);
    if (rc == CUPLUG_OK) return CUPLUG_OK;
    if (rc > 0 || rc < CUPLUG_E_WRONG_DEVICE) rc = CUPLUG_E_INVALID_ARGUMENT; /* not a cuplug status */
    if (op_error[0] != '\0') return cuplug_cpu_fail(h, rc, "%s", op_error);
    return cuplug_cpu_fail(h, rc, "%s failed (status %d)", op->name, rc);
}

CUPLUG_API int cuplug_backend_call(cuplug_backend* h, const char* op, const cuplug_tensor* in, int n_in,
                                   cuplug_tensor* out, int n_out, const cuplug_attr* attrs, int n_attrs,
                                   uint64_t stream) {
    (void)stream; /* no streams on the CPU: the call returns when the outputs are written */
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = cuplug_cpu_call_locked(h, op, in, n_in, out, n_out, attrs, n_attrs);
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API int cuplug_backend_stream_wait(cuplug_backend* h, uint64_t waiter, uint64_t signaler) {
    (void)waiter, (void)signaler;
    return h == NULL ? CUPLUG_E_INVALID_ARGUMENT : CUPLUG_OK;
}

CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, cuplug_dtype dtype, int ndim, const int64_t* shape) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    long long rc, numel = 0, nbytes = 0;
    int itemsize = cuplug_dtype_size(dtype);
    char dt[64];
    if (itemsize == 0) {
        rc = cuplug_cpu_fail(h, CUPLUG_E_INVALID_ARGUMENT, "alloc: dtype %s is not one cuplug supports",
                             cuplug_dtype_text(dtype, dt, sizeof dt));
    } else if ((rc = cuplug_check_shape("alloc", ndim, shape, itemsize, &numel, &nbytes, h->last_error,
                                        sizeof h->last_error)) == CUPLUG_OK) {
        void* p = NULL;
        /* C11 aligned_alloc wants a multiple of the alignment; 64 bytes at least, so a
         * 0-element tensor still has a unique, non-NULL pointer. */
        if ((unsigned long long)nbytes <= (unsigned long long)SIZE_MAX - CUPLUG_CPU_ALIGN) {
            size_t size = ((size_t)nbytes + CUPLUG_CPU_ALIGN - 1) / CUPLUG_CPU_ALIGN * CUPLUG_CPU_ALIGN;
            p = aligned_alloc(CUPLUG_CPU_ALIGN, size > 0 ? size : CUPLUG_CPU_ALIGN);
        }
        if (p == NULL) {
            rc = cuplug_cpu_fail(h, CUPLUG_E_OUT_OF_MEMORY, "alloc: out of host memory for %lld bytes", nbytes);
        } else {
            rc = cuplug_table_add(&h->tensors, p, dtype, ndim, shape, numel, nbytes);
            if (rc < 0) {
                free(p);
                cuplug_cpu_fail(h, (int)rc, "alloc: resident tensor table full");
            }
        }
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* The live tensor behind id, or NULL with the error set. */
static cuplug_resident* cuplug_cpu_resident(cuplug_backend* h, long long id, const char* what) {
    cuplug_resident* r = cuplug_table_get(&h->tensors, id);
    if (r == NULL)
        cuplug_cpu_fail(h, CUPLUG_E_BAD_BUFFER, "%s: id %lld is not a live tensor of this instance (freed, stale, "
                        "of another instance or made up)", what, id);
    return r;
}

/* Copies a resident tensor's whole bytes from/to host memory (to_host: download). */
static int cuplug_cpu_copy(cuplug_backend* h, long long id, void* host, long long nbytes, int to_host) {
    const char* what = to_host ? "download" : "upload";
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = CUPLUG_OK;
    cuplug_resident* r = cuplug_cpu_resident(h, id, what);
    if (r == NULL) {
        rc = CUPLUG_E_BAD_BUFFER;
    } else if (nbytes != r->nbytes) {
        char s[256];
        rc = cuplug_cpu_fail(h, nbytes >= 0 && nbytes < r->nbytes ? CUPLUG_E_BUFFER_TOO_SMALL : CUPLUG_E_INVALID_ARGUMENT,
                             "%s: nbytes must be the tensor's whole size, %lld bytes (%s %s), got %lld", what,
                             r->nbytes, cuplug_dtype_name(r->dtype), cuplug_shape_text(r->ndim, r->shape, s, sizeof s),
                             nbytes);
    } else if (host == NULL && nbytes > 0) {
        rc = cuplug_cpu_fail(h, CUPLUG_E_INVALID_ARGUMENT, "%s: NULL host pointer", what);
    } else if (nbytes > 0) {
        if (to_host)
            memcpy(host, r->ptr, (size_t)nbytes);
        else
            memcpy(r->ptr, host, (size_t)nbytes);
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id, const void* host, long long nbytes) {
    return cuplug_cpu_copy(h, id, (void*)host, nbytes, 0);
}

CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id, void* host, long long nbytes) {
    return cuplug_cpu_copy(h, id, host, nbytes, 1);
}

CUPLUG_API int cuplug_backend_tensor(cuplug_backend* h, long long id, cuplug_tensor* out) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = CUPLUG_OK;
    cuplug_resident* r = cuplug_cpu_resident(h, id, "tensor");
    if (r == NULL)
        rc = CUPLUG_E_BAD_BUFFER;
    else if (out == NULL)
        rc = cuplug_cpu_fail(h, CUPLUG_E_INVALID_ARGUMENT, "tensor: NULL descriptor pointer");
    else
        cuplug_resident_descriptor(r, CUPLUG_DEVICE_CPU, 0, out);
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API int cuplug_backend_free(cuplug_backend* h, long long id) {
    if (h == NULL) return CUPLUG_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    int rc = CUPLUG_OK;
    cuplug_resident* r = cuplug_cpu_resident(h, id, "free");
    if (r == NULL)
        rc = CUPLUG_E_BAD_BUFFER;
    else
        free(cuplug_table_remove(&h->tensors, r));
    pthread_mutex_unlock(&h->lock);
    return rc;
}

CUPLUG_API int cuplug_backend_sync(cuplug_backend* h) { return h == NULL ? CUPLUG_E_INVALID_ARGUMENT : CUPLUG_OK; }

static void cuplug_cpu_release(void* ptr, void* ctx) {
    (void)ctx;
    free(ptr);
}

CUPLUG_API void cuplug_backend_destroy(cuplug_backend* h) {
    if (h == NULL) return;
    pthread_mutex_lock(&cuplug_cpu_list_lock);
    if (h->prev != NULL) h->prev->next = h->next;
    else cuplug_cpu_instances = h->next;
    if (h->next != NULL) h->next->prev = h->prev;
    pthread_mutex_unlock(&cuplug_cpu_list_lock);
    pthread_mutex_lock(&h->lock); /* a call still running on another thread finishes first */
    cuplug_table_clear(&h->tensors, cuplug_cpu_release, NULL);
    pthread_mutex_unlock(&h->lock);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

#endif /* CUPLUG_CPU_BACKEND_H */
