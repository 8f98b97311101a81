/*
 * A backend library that is wrong on purpose, for the reliability tests. It is
 * planted in place of a real artifact (with a manifest that matches its bytes),
 * so verification passes and the loader meets the fault at dlopen time:
 *   -DODD_ABI_VERSION=99   the v2 symbol set, reporting ABI version 99 -> abi-mismatch
 *   -DODD_ABI_V1           a 0.1.0-era library: ABI version 1 and the v1 symbol set
 *                          (run, run_resident, alloc(h, n), float uploads) -> abi-mismatch
 *                          naming both versions (the version is checked first)
 *   -DODD_CREATE_NULL      create() returns NULL with a reason           -> load-failed
 *   -DODD_MISSING_SYMBOLS  exports only cuplug_backend_abi_version       -> load-failed
 * Its ops never run: the loader must refuse it before that. Build it with
 * -fvisibility=hidden (only CUPLUG_API functions are exported).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef ODD_ABI_V1
/* v1's declarations (cuplug/backend.h now declares v2's, which conflict) */
#define CUPLUG_API __attribute__((visibility("default")))
#define CUPLUG_BACKEND_ABI_VERSION 1
#define CUPLUG_E_BAD_BUFFER (-3)
#define CUPLUG_E_DEVICE (-5)
typedef struct cuplug_backend cuplug_backend;
#undef ODD_ABI_VERSION
#define ODD_ABI_VERSION 1
#else
#include "cuplug/backend.h"
#endif
#ifndef ODD_ABI_VERSION
#define ODD_ABI_VERSION CUPLUG_BACKEND_ABI_VERSION
#endif

CUPLUG_API int cuplug_backend_abi_version(void) { return ODD_ABI_VERSION; }

#ifndef ODD_MISSING_SYMBOLS
static int write_text(const char* text, char* buf, int len) {
    int need = (int)strlen(text);
    if (buf && len > 0) {
        int n = need < len - 1 ? need : len - 1;
        memcpy(buf, text, (size_t)n);
        buf[n] = '\0';
    }
    return need;
}

static struct cuplug_backend {
    int unused;
} the_instance;

/* ---- the lifecycle, the same in v1 and v2 ---- */
CUPLUG_API cuplug_backend* cuplug_backend_create(const char* device_pref) {
    (void)device_pref;
#ifdef ODD_CREATE_NULL
    (void)the_instance;
    return NULL;
#else
    return &the_instance;
#endif
}
CUPLUG_API int cuplug_backend_last_create_error(char* buf, int len) {
    return write_text("odd backend: create refused on purpose", buf, len);
}
CUPLUG_API int cuplug_backend_ping(cuplug_backend* h, char* buf, int len) {
    (void)h;
    return write_text("{\"backend\":\"vector\",\"variant\":\"odd\",\"ops\":{}}", buf, len);
}
CUPLUG_API int cuplug_backend_sync(cuplug_backend* h) { (void)h; return 0; }
CUPLUG_API int cuplug_backend_free(cuplug_backend* h, long long id) { (void)h, (void)id; return CUPLUG_E_BAD_BUFFER; }
CUPLUG_API int cuplug_backend_last_error(cuplug_backend* h, char* buf, int len) {
    (void)h;
    return write_text("odd backend", buf, len);
}
CUPLUG_API void cuplug_backend_destroy(cuplug_backend* h) { (void)h; }

#ifdef ODD_ABI_V1
/* ---- v1 (0.1.0): float32 vectors ---- */
CUPLUG_API int cuplug_backend_run(cuplug_backend* h, const char* op, const float* x, const float* y, float alpha,
                                  float beta, float* out, long long n) {
    (void)h, (void)op, (void)x, (void)y, (void)alpha, (void)beta, (void)out, (void)n;
    return CUPLUG_E_DEVICE;
}
CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, long long n) { (void)h, (void)n; return CUPLUG_E_DEVICE; }
CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id, const float* host, long long n) {
    (void)h, (void)id, (void)host, (void)n;
    return CUPLUG_E_DEVICE;
}
CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id, float* host, long long n) {
    (void)h, (void)id, (void)host, (void)n;
    return CUPLUG_E_DEVICE;
}
CUPLUG_API int cuplug_backend_run_resident(cuplug_backend* h, const char* op, long long in_id, long long in2_id,
                                           long long out_id, float alpha, float beta, long long n) {
    (void)h, (void)op, (void)in_id, (void)in2_id, (void)out_id, (void)alpha, (void)beta, (void)n;
    return CUPLUG_E_DEVICE;
}
#else
/* ---- v2: typed tensors ---- */
CUPLUG_API int cuplug_backend_call(cuplug_backend* h, const char* op, const cuplug_tensor* in, int n_in,
                                   cuplug_tensor* out, int n_out, const cuplug_attr* attrs, int n_attrs,
                                   uint64_t stream) {
    (void)h, (void)op, (void)in, (void)n_in, (void)out, (void)n_out, (void)attrs, (void)n_attrs, (void)stream;
    return CUPLUG_E_DEVICE;
}
CUPLUG_API int cuplug_backend_stream_wait(cuplug_backend* h, uint64_t waiter, uint64_t signaler) {
    (void)h, (void)waiter, (void)signaler;
    return 0;
}
CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, cuplug_dtype dtype, int ndim, const int64_t* shape) {
    (void)h, (void)dtype, (void)ndim, (void)shape;
    return CUPLUG_E_DEVICE;
}
CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id, const void* host, long long nbytes) {
    (void)h, (void)id, (void)host, (void)nbytes;
    return CUPLUG_E_DEVICE;
}
CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id, void* host, long long nbytes) {
    (void)h, (void)id, (void)host, (void)nbytes;
    return CUPLUG_E_DEVICE;
}
CUPLUG_API int cuplug_backend_tensor(cuplug_backend* h, long long id, cuplug_tensor* out) {
    (void)h, (void)id, (void)out;
    return CUPLUG_E_BAD_BUFFER;
}
#endif
#endif
