/*
 * A backend that lies about itself, for tests/test_hostile_operands.py. It is planted in place of a
 * real artifact (with a manifest that matches its bytes), so the loader meets it where it would meet
 * a broken backend in the field. What it says comes from the environment, read at each call:
 *   LYING_OPS           the "ops" object of its ping (default: one valid float32 "add")
 *   LYING_DEVICE        the ping's device type (default "cuda")
 *   LYING_CALL_STATUS   what call() returns without doing anything (default 0)
 *   LYING_ERROR_CLAIM   the length last_error() claims to need (default: the real length)
 * Its memory functions are honest (malloc), so only the lies a test names are told.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuplug/backend.h"

static struct cuplug_backend {
    int unused;
} the_instance;

static const char* env_or(const char* name, const char* fallback) {
    const char* v = getenv(name);
    return v != NULL ? v : fallback;
}

static int write_text(const char* text, char* buf, int len) {
    int need = (int)strlen(text);
    if (buf != NULL && len > 0) {
        int n = need < len - 1 ? need : len - 1;
        memcpy(buf, text, (size_t)n);
        buf[n] = '\0';
    }
    return need;
}

CUPLUG_API int cuplug_backend_abi_version(void) { return CUPLUG_BACKEND_ABI_VERSION; }

CUPLUG_API cuplug_backend* cuplug_backend_create(const char* device_pref) {
    (void)device_pref;
    return &the_instance;
}

CUPLUG_API int cuplug_backend_last_create_error(char* buf, int len) { return write_text("", buf, len); }

CUPLUG_API int cuplug_backend_ping(cuplug_backend* h, char* buf, int len) {
    (void)h;
    static char text[1 << 16];
    snprintf(text, sizeof text,
             "{\"backend\":\"vector\",\"variant\":\"fatbin\",\"abi\":2,\"driver_version\":13000,"
             "\"runtime_version\":13000,\"device\":{\"type\":\"%s\",\"index\":0,\"name\":\"liar\","
             "\"capability\":[9,0],\"memory_free\":1048576,\"memory_total\":1048576,\"temperature_c\":null},"
             "\"stream\":0,\"sass\":\"sm_90\",\"ptx\":\"\",\"ops\":%s}",
             env_or("LYING_DEVICE", "cuda"),
             env_or("LYING_OPS",
                    "{\"add\":{\"inputs\":[{\"name\":\"x\",\"dtypes\":[\"float32\"]},{\"name\":\"y\",\"like\":0}],"
                    "\"outputs\":[{\"name\":\"out\",\"dtype\":{\"like\":0},\"shape\":{\"like\":0}}],"
                    "\"attrs\":[],\"size_rules\":[],\"elementwise\":true,\"sample_n\":16}}"));
    return write_text(text, buf, len);
}

CUPLUG_API int cuplug_backend_call(cuplug_backend* h, const char* op, const cuplug_tensor* in, int n_in,
                                   cuplug_tensor* out, int n_out, const cuplug_attr* attrs, int n_attrs,
                                   uint64_t stream) {
    (void)h, (void)op, (void)in, (void)n_in, (void)out, (void)n_out, (void)attrs, (void)n_attrs, (void)stream;
    return atoi(env_or("LYING_CALL_STATUS", "0"));
}

CUPLUG_API int cuplug_backend_stream_wait(cuplug_backend* h, uint64_t waiter, uint64_t signaler) {
    (void)h, (void)waiter, (void)signaler;
    return CUPLUG_OK;
}

/* One resident tensor at a time is all the tests need. */
static cuplug_tensor resident;
static int64_t resident_shape[32];

CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, cuplug_dtype dtype, int ndim, const int64_t* shape) {
    (void)h;
    long long n = 1;
    if (ndim < 0 || ndim > 32) return CUPLUG_E_INVALID_ARGUMENT;
    for (int i = 0; i < ndim; ++i) n *= shape[i], resident_shape[i] = shape[i];
    free(resident.data);
    resident.data = malloc((size_t)(n * (dtype.bits / 8)) + 1);
    resident.device_type = CUPLUG_DEVICE_CPU;
    resident.ndim = ndim;
    resident.dtype = dtype;
    resident.shape = resident_shape;
    return 1;
}

CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id, const void* host, long long nbytes) {
    (void)h, (void)id;
    memcpy(resident.data, host, (size_t)nbytes);
    return CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id, void* host, long long nbytes) {
    (void)h, (void)id;
    memcpy(host, resident.data, (size_t)nbytes);
    return CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_tensor(cuplug_backend* h, long long id, cuplug_tensor* out) {
    (void)h, (void)id;
    *out = resident;
    return CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_free(cuplug_backend* h, long long id) {
    (void)h, (void)id;
    return CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_sync(cuplug_backend* h) {
    (void)h;
    return CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_last_error(cuplug_backend* h, char* buf, int len) {
    (void)h;
    const char* claim = getenv("LYING_ERROR_CLAIM");
    int real = write_text("the liar says no", buf, len);
    return claim != NULL ? atoi(claim) : real;
}

CUPLUG_API void cuplug_backend_destroy(cuplug_backend* h) { (void)h; }
