/*
 * cuplug backend C ABI, version 1.
 *
 * Every cuplug backend (the CUDA variants and the CPU twin) is a shared library
 * that exports exactly the functions below and nothing else. The header names no
 * CUDA type: callers (the Python loader, C programs) never see a CUcontext, a
 * stream or a device pointer. All device state lives behind the opaque handle.
 *
 * Conventions
 *  - Every function that returns int returns CUPLUG_OK (0) or a negative
 *    cuplug_status code; the instance's message is then readable through
 *    cuplug_backend_last_error().
 *  - Element counts are `long long` and must be > 0. Host arrays are float32
 *    and are only read during the call (outputs only written during it):
 *    the backend copies through buffers it owns, never keeping a caller pointer.
 *  - Text outputs (buf, len) are always NUL-terminated when len > 0 and
 *    truncated to fit; the return value is the full length needed, or < 0.
 *  - A handle may be used from several threads; each call on one handle is
 *    serialized by the backend. Two handles never share a stream or buffer.
 */
#ifndef CUPLUG_BACKEND_H
#define CUPLUG_BACKEND_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CUPLUG_API __declspec(dllexport)
#else
#define CUPLUG_API __attribute__((visibility("default")))
#endif

/* Bumped on any change of a signature or of the meaning of an argument. */
#define CUPLUG_BACKEND_ABI_VERSION 1

typedef struct cuplug_backend cuplug_backend;

/* Status codes (stable; the Python loader maps them to exceptions). */
typedef enum cuplug_status {
    CUPLUG_OK = 0,
    CUPLUG_E_INVALID_ARGUMENT = -1, /* NULL pointer, n <= 0, n too large    */
    CUPLUG_E_UNKNOWN_OP = -2,       /* op is not add, scale_add or sum       */
    CUPLUG_E_BAD_BUFFER = -3,       /* stale, freed or foreign buffer id     */
    CUPLUG_E_OUT_OF_MEMORY = -4,    /* host or device allocation failed      */
    CUPLUG_E_DEVICE = -5,           /* any other CUDA runtime error          */
    CUPLUG_E_NO_KERNEL_IMAGE = -6,  /* no SASS/PTX in the file fits this GPU */
    CUPLUG_E_BUFFER_TOO_SMALL = -7  /* a resident buffer is shorter than n   */
} cuplug_status;

/* Returns CUPLUG_BACKEND_ABI_VERSION of the build; checked before any other call. */
CUPLUG_API int cuplug_backend_abi_version(void);

/*
 * Creates an instance. device_pref: NULL, "" or "auto" for device 0, or a
 * decimal device index as the driver numbers devices after CUDA_VISIBLE_DEVICES.
 * The CUDA backend selects the device, forces context creation and creates the
 * instance's own stream under a process-wide lock. Returns NULL on failure;
 * the reason is then readable through cuplug_backend_last_create_error().
 */
CUPLUG_API cuplug_backend* cuplug_backend_create(const char* device_pref);
CUPLUG_API int cuplug_backend_last_create_error(char* buf, int len);

/*
 * Writes one JSON object describing the instance: "backend", "variant",
 * "abi", "driver_version", "runtime_version", "device" {"index","name",
 * "capability","memory_free","memory_total","temperature_c"|null},
 * "sass", "ptx" (targets compiled in). Runs a smoke kernel first, so a missing
 * kernel image fails here (CUPLUG_E_NO_KERNEL_IMAGE), not in the user's work.
 */
CUPLUG_API int cuplug_backend_ping(cuplug_backend* h, char* buf, int len);

/*
 * The reference "vector" operations on host arrays:
 *   "add"        out[i] = x[i] + y[i]           (y required)
 *   "scale_add"  out[i] = alpha * x[i] + beta   (y ignored, may be NULL)
 *   "sum"        out[0] = sum of x[0..n)        (accumulated in float64)
 * out holds n elements (1 for "sum").
 */
CUPLUG_API int cuplug_backend_run(cuplug_backend* h, const char* op,
                                  const float* x, const float* y,
                                  float alpha, float beta,
                                  float* out, long long n);

/*
 * Resident buffers: float32 arrays that stay in the backend's memory (device
 * memory for CUDA) so chained work does not cross PCIe each time.
 * alloc returns a buffer id > 0, or a negative cuplug_status.
 * Ids are never reused within an instance and are checked on every call.
 */
CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, long long n);
CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id,
                                     const float* host, long long n);
CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id,
                                       float* host, long long n);
/* Same ops as cuplug_backend_run; in2_id is 0 where the op takes one input.
 * For "sum" the output buffer receives one element. Asynchronous on CUDA:
 * cuplug_backend_sync() or a download waits for it. */
CUPLUG_API int cuplug_backend_run_resident(cuplug_backend* h, const char* op,
                                           long long in_id, long long in2_id,
                                           long long out_id,
                                           float alpha, float beta,
                                           long long n);
CUPLUG_API int cuplug_backend_sync(cuplug_backend* h);
CUPLUG_API int cuplug_backend_free(cuplug_backend* h, long long id);

/* The instance's private copy of its last error message ("" if none). */
CUPLUG_API int cuplug_backend_last_error(cuplug_backend* h, char* buf, int len);

/* Frees every buffer and the stream; h must not be used afterwards. NULL is a no-op. */
CUPLUG_API void cuplug_backend_destroy(cuplug_backend* h);

#ifdef __cplusplus
}
#endif

#endif /* CUPLUG_BACKEND_H */
