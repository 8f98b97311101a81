/*
 * A fake libcuda.so.1 for CPU-only tests, configured by environment variables:
 *   FAKE_CUDA_INIT_ERROR     cuInit's return code (default 0)
 *   FAKE_CUDA_DRIVER_VERSION cuDriverGetVersion (default 13000)
 *   FAKE_CUDA_DEVICES        comma list of capabilities, e.g. "9.0,8.6" (default "9.0")
 *   FAKE_CUDA_MARKER         a file created when the library is loaded
 *   FAKE_CUDA_INIT_SLEEP_MS  cuInit sleeps this long first (a hung driver)
 * Lies and failures (issue 18), each off unless set:
 *   FAKE_CUDA_VERSION_ERROR  cuDriverGetVersion returns this error (and writes nothing)
 *   FAKE_CUDA_ERROR_NAME     cuGetErrorName answers this string for every error (any bytes, e.g. not UTF-8)
 *   FAKE_CUDA_ERROR_NAME_RC  ... and returns this code (it writes the name all the same)
 *   FAKE_CUDA_COUNT          cuDeviceGetCount reports this many devices (e.g. 2147483647)
 *   FAKE_CUDA_COUNT_UNWRITTEN cuDeviceGetCount succeeds without writing the count
 *   FAKE_CUDA_DEVICE_GET_ERROR cuDeviceGet fails with this error
 *   FAKE_CUDA_ATTR_FAIL      cuDeviceGetAttribute of this attribute (75 major, 76 minor) fails with 1,
 *                            after writing 0 into *value (as a driver may)
 *   FAKE_CUDA_ATTR_FAIL_DEVICE only for this device ordinal (default: every device)
 *   FAKE_CUDA_NAME           cuDeviceGetName answers this name (escape codes, newlines...)
 *   FAKE_CUDA_ATTR_FAIL_RC   the code that failing cuDeviceGetAttribute returns (default 1)
 *   FAKE_CUDA_COUNT_ERROR    cuDeviceGetCount fails with this code
 *   FAKE_CUDA_PRIMARY_CTX    cuDevicePrimaryCtxRetain/Release(_v2) work and are counted (else they answer 801,
 *                            not supported); fake_cuda_count() reads the counters (FAKE_COUNT_*)
 *   FAKE_CUDA_RETAIN_ERROR   ... and cuDevicePrimaryCtxRetain fails with this code
 * Compiled with -DFAKE_NO_UUID it lacks cuDeviceGetUuid and cuDeviceGetUuid_v2 (-DFAKE_NO_UUID_V2:
 * only the _v2); with
 * -DFAKE_NO_SYMBOLS it exports no CUDA entry point at all.
 * CUDA_VISIBLE_DEVICES is emulated as the driver does it inside cuInit: a comma
 * list of indices or GPU-UUID prefixes, ending at the first bad entry; "" -> none.
 * cuGetProcAddress answers with this library's own symbols.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef FAKE_NO_SYMBOLS
#define MAX_DEV 16
typedef int CUresult;
static int n_all, n_vis, vis[MAX_DEV], caps[MAX_DEV][2], inited;

static void uuid_of(int i, unsigned char out[16]) {
    for (int k = 0; k < 16; ++k) out[k] = (unsigned char)(k == 15 ? i : 0xab);
}
static void uuid_str(int i, char* s) {
    unsigned char u[16];
    uuid_of(i, u);
    sprintf(s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
            u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static void* self_handle;

__attribute__((constructor)) static void on_load(void) {
    Dl_info info;
    if (dladdr((void*)&on_load, &info) && info.dli_fname)
        self_handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
    const char* m = getenv("FAKE_CUDA_MARKER");
    if (m) fclose(fopen(m, "w"));
}

static void parse(void) {
    const char* d = getenv("FAKE_CUDA_DEVICES");
    char buf[512];
    snprintf(buf, sizeof buf, "%s", d ? d : "9.0");
    n_all = 0;
    for (char* t = strtok(buf, ","); t && n_all < MAX_DEV; t = strtok(NULL, ",")) {
        if (sscanf(t, "%d.%d", &caps[n_all][0], &caps[n_all][1]) == 2) n_all++;
    }
    const char* v = getenv("CUDA_VISIBLE_DEVICES");
    n_vis = 0;
    if (v == NULL) {
        for (int i = 0; i < n_all; ++i) vis[n_vis++] = i;
        return;
    }
    snprintf(buf, sizeof buf, "%s", v);
    for (char* t = strtok(buf, ","); t && n_vis < MAX_DEV; t = strtok(NULL, ",")) {
        int found = -1;
        if (strncmp(t, "GPU-", 4) == 0) {
            for (int i = 0; i < n_all; ++i) {
                char s[64];
                uuid_str(i, s);
                if (strncmp(s, t, strlen(t)) == 0) found = i;
            }
        } else {
            char* end;
            long idx = strtol(t, &end, 10);
            if (*end == '\0' && idx >= 0 && idx < n_all) found = (int)idx;
        }
        if (found < 0) break; /* the list ends at the first bad entry */
        vis[n_vis++] = found;
    }
}

/* What the tests count: cuInit calls, primary-context references held, retains, releases (_v2 and not),
 * the device last retained. */
enum { FAKE_COUNT_INIT, FAKE_COUNT_REFS, FAKE_COUNT_RETAINS, FAKE_COUNT_RELEASE_V2, FAKE_COUNT_RELEASE, FAKE_COUNT_DEV };
static int counters[6];
int fake_cuda_count(int which) { return which >= 0 && which < 6 ? counters[which] : -1; }

CUresult cuInit(unsigned flags) {
    ++counters[FAKE_COUNT_INIT];
    if (flags != 0) return 1; /* CUDA_ERROR_INVALID_VALUE: the flags must be 0, as the real driver says */
    const char* sleep_ms = getenv("FAKE_CUDA_INIT_SLEEP_MS");
    if (sleep_ms && atol(sleep_ms) > 0) {
        struct timespec ts = {atol(sleep_ms) / 1000, (atol(sleep_ms) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    const char* e = getenv("FAKE_CUDA_INIT_ERROR");
    if (e && atoi(e)) return atoi(e);
    parse();
    inited = 1;
    return n_vis ? 0 : 100; /* CUDA_ERROR_NO_DEVICE */
}
static int env_int(const char* name, int fallback) {
    const char* e = getenv(name);
    return e && *e ? atoi(e) : fallback;
}
CUresult cuDriverGetVersion(int* v) {
    if (env_int("FAKE_CUDA_VERSION_ERROR", 0)) return env_int("FAKE_CUDA_VERSION_ERROR", 0);
    const char* e = getenv("FAKE_CUDA_DRIVER_VERSION");
    *v = e ? atoi(e) : 13000;
    return 0;
}
CUresult cuDeviceGetCount(int* n) {
    if (!inited) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
    if (env_int("FAKE_CUDA_COUNT_ERROR", 0)) return env_int("FAKE_CUDA_COUNT_ERROR", 0);
    if (env_int("FAKE_CUDA_COUNT_UNWRITTEN", 0)) return 0; /* success, and nothing written */
    *n = env_int("FAKE_CUDA_COUNT", n_vis);
    return 0;
}
CUresult cuDeviceGet(int* dev, int ordinal) {
    if (!inited) return 3;
    if (env_int("FAKE_CUDA_DEVICE_GET_ERROR", 0)) return env_int("FAKE_CUDA_DEVICE_GET_ERROR", 0);
    if (ordinal < 0 || ordinal >= n_vis) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}
CUresult cuDeviceGetAttribute(int* value, int attrib, int dev) {
    if (dev < 0 || dev >= n_vis) return 101;
    int only = env_int("FAKE_CUDA_ATTR_FAIL_DEVICE", -1);
    if (attrib == env_int("FAKE_CUDA_ATTR_FAIL", -1) && (only < 0 || only == dev)) {
        *value = 0;
        return env_int("FAKE_CUDA_ATTR_FAIL_RC", 1); /* CUDA_ERROR_INVALID_VALUE, or the code asked for */
    }
    if (attrib == 75) *value = caps[vis[dev]][0];
    else if (attrib == 76) *value = caps[vis[dev]][1];
    else *value = 0;
    return 0;
}
CUresult cuDeviceGetName(char* name, int len, int dev) {
    if (dev < 0 || dev >= n_vis) return 101;
    if (getenv("FAKE_CUDA_NAME")) {
        snprintf(name, (size_t)len, "%s", getenv("FAKE_CUDA_NAME"));
        return 0;
    }
    snprintf(name, (size_t)len, "Fake GPU %d (CC %d.%d)", vis[dev], caps[vis[dev]][0], caps[vis[dev]][1]);
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t* bytes, int dev) {
    if (dev < 0 || dev >= n_vis) return 101;
    *bytes = (size_t)16 << 30;
    return 0;
}
#ifndef FAKE_NO_UUID
static CUresult uuid_get(unsigned char* uuid, int dev) {
    if (dev < 0 || dev >= n_vis) return 101;
    uuid_of(vis[dev], uuid);
    return 0;
}
#ifndef FAKE_NO_UUID_V2
CUresult cuDeviceGetUuid_v2(unsigned char* uuid, int dev) { return uuid_get(uuid, dev); }
#endif
CUresult cuDeviceGetUuid(unsigned char* uuid, int dev) { return uuid_get(uuid, dev); }
#endif
CUresult cuGetErrorName(CUresult err, const char** s) {
    if (getenv("FAKE_CUDA_ERROR_NAME")) {
        *s = getenv("FAKE_CUDA_ERROR_NAME");
        return env_int("FAKE_CUDA_ERROR_NAME_RC", 0); /* a non-zero rc: the name written must not be used */
    }
    switch (err) {
        case 0: *s = "CUDA_SUCCESS"; return 0;
        case 3: *s = "CUDA_ERROR_NOT_INITIALIZED"; return 0;
        case 34: *s = "CUDA_ERROR_STUB_LIBRARY"; return 0;
        case 35: *s = "CUDA_ERROR_INSUFFICIENT_DRIVER"; return 0;
        case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
        case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
        default: *s = "CUDA_ERROR_UNKNOWN"; return 999 == err ? 0 : 1;
    }
}
static CUresult primary_ctx(int dev) {
    if (!getenv("FAKE_CUDA_PRIMARY_CTX")) return 801; /* CUDA_ERROR_NOT_SUPPORTED */
    if (!inited) return 3;
    return dev < 0 || dev >= n_vis ? 101 : 0;
}
CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) {
    CUresult rc = primary_ctx(dev);
    if (!rc && env_int("FAKE_CUDA_RETAIN_ERROR", 0)) rc = env_int("FAKE_CUDA_RETAIN_ERROR", 0);
    if (rc) return rc;
    *ctx = &counters; /* any non-null handle */
    ++counters[FAKE_COUNT_REFS];
    ++counters[FAKE_COUNT_RETAINS];
    counters[FAKE_COUNT_DEV] = dev;
    return 0;
}
static CUresult release(int dev, int which) {
    ++counters[which]; /* every call counts, a wrong one too */
    CUresult rc = primary_ctx(dev);
    if (rc) return rc;
    if (counters[FAKE_COUNT_REFS] == 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT: released more than retained */
    --counters[FAKE_COUNT_REFS];
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return release(dev, FAKE_COUNT_RELEASE_V2); }
CUresult cuDevicePrimaryCtxRelease(int dev) { return release(dev, FAKE_COUNT_RELEASE); }
CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, unsigned long long flags) {
    (void)version; (void)flags;
    /* The real driver maps a base name to its newest ABI ("cuDeviceTotalMem" -> _v2). */
    static const char* suffixes[] = {"_v2", ""};
    *pfn = NULL;
    for (int i = 0; i < 2 && self_handle && *pfn == NULL; ++i) {
        char name[128];
        snprintf(name, sizeof name, "%s%s", symbol, suffixes[i]);
        *pfn = dlsym(self_handle, name);
    }
    return *pfn ? 0 : 500; /* CUDA_ERROR_NOT_FOUND */
}
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status) {
    CUresult rc = cuGetProcAddress(symbol, pfn, version, flags);
    if (status) *status = rc ? 1 : 0;
    return rc;
}
#else
int fake_cuda_has_no_entry_points;
#endif
