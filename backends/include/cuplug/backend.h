/*
 * cuplug backend C ABI, version 2: typed N-D tensors, attributes, streams.
 *
 * Every cuplug backend (the CUDA variants and the CPU twin) is a shared library
 * that exports exactly the functions below and nothing else. The header names no
 * CUDA type: a stream is an opaque integer, a device is a (type, id) pair as in
 * DLPack, and all device state lives behind the opaque handle.
 *
 * Conventions
 *  - Every function that returns int returns CUPLUG_OK (0) or a negative
 *    cuplug_status code; the instance's message is then readable through
 *    cuplug_backend_last_error() (for create: cuplug_backend_last_create_error()).
 *  - Text outputs (buf, len) are always NUL-terminated when len > 0 and
 *    truncated to fit; the return value is the full length needed (as snprintf
 *    does), so a caller retries with a larger buffer and nothing is lost.
 *  - A handle may be used from several threads; each call on one handle is
 *    serialized by the backend. Two handles never share a stream or buffer.
 *  - cuplug_tensor is DLPack's DLTensor field for field (same order, same
 *    types), so a DLTensor* converts to a cuplug_tensor* without a copy.
 */
#ifndef CUPLUG_BACKEND_H
#define CUPLUG_BACKEND_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CUPLUG_API __declspec(dllexport)
#else
#define CUPLUG_API __attribute__((visibility("default")))
#endif

/* Bumped on any change of a signature or of the meaning of an argument. */
#define CUPLUG_BACKEND_ABI_VERSION 2

typedef struct cuplug_backend cuplug_backend;

/* Status codes (stable; the Python loader maps them to exceptions). */
typedef enum cuplug_status {
    CUPLUG_OK = 0,
    CUPLUG_E_INVALID_ARGUMENT = -1, /* bad tensor, dtype, shape, attribute, NULL    */
    CUPLUG_E_UNKNOWN_OP = -2,       /* the op is not in this backend's table        */
    CUPLUG_E_BAD_BUFFER = -3,       /* stale, freed or foreign resident tensor id   */
    CUPLUG_E_OUT_OF_MEMORY = -4,    /* host or device allocation failed             */
    CUPLUG_E_DEVICE = -5,           /* any other CUDA runtime error                 */
    CUPLUG_E_NO_KERNEL_IMAGE = -6,  /* no SASS/PTX in the file fits this GPU        */
    CUPLUG_E_BUFFER_TOO_SMALL = -7, /* a host buffer is shorter than the tensor     */
    CUPLUG_E_WRONG_DEVICE = -8      /* a tensor lives on another device or context  */
} cuplug_status;

/* DLPack's DLDeviceType values for the devices a backend may meet. */
typedef enum cuplug_device_type {
    CUPLUG_DEVICE_CPU = 1,       /* kDLCPU      */
    CUPLUG_DEVICE_CUDA = 2,      /* kDLCUDA     */
    CUPLUG_DEVICE_CUDA_HOST = 3  /* kDLCUDAHost: pinned host memory */
} cuplug_device_type;

/* DLPack's DLDataTypeCode values. */
typedef enum cuplug_dtype_code {
    CUPLUG_DTYPE_INT = 0,
    CUPLUG_DTYPE_UINT = 1,
    CUPLUG_DTYPE_FLOAT = 2,
    CUPLUG_DTYPE_BFLOAT = 4,
    CUPLUG_DTYPE_BOOL = 6 /* kDLBool: 8 bits, 0 or 1 */
} cuplug_dtype_code;

/* DLDataType: e.g. float16 = {2, 16, 1}, bfloat16 = {4, 16, 1}, int8 = {0, 8, 1}. */
typedef struct cuplug_dtype {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes; /* always 1 here */
} cuplug_dtype;

/* DLTensor, field for field. */
typedef struct cuplug_tensor {
    void* data;           /* the allocation's base pointer (host or device)        */
    int32_t device_type;  /* cuplug_device_type                                     */
    int32_t device_id;    /* CUDA device ordinal as the driver numbers it; 0 on CPU */
    int32_t ndim;         /* 0 for a scalar                                         */
    cuplug_dtype dtype;
    int64_t* shape;       /* ndim extents                                           */
    int64_t* strides;     /* ndim strides in elements; NULL means C-contiguous      */
    uint64_t byte_offset; /* the first element is at (char*)data + byte_offset      */
} cuplug_tensor;

typedef enum cuplug_attr_kind { CUPLUG_ATTR_INT64 = 0, CUPLUG_ATTR_FLOAT64 = 1 } cuplug_attr_kind;

/* A named scalar argument of an op, e.g. {"blocksize", CUPLUG_ATTR_INT64, {.i = 256}}. */
typedef struct cuplug_attr {
    const char* name;
    int32_t kind; /* cuplug_attr_kind */
    union {
        int64_t i;
        double f;
    } value;
} cuplug_attr;

/* Returns CUPLUG_BACKEND_ABI_VERSION of the build; checked before any other call. */
CUPLUG_API int cuplug_backend_abi_version(void);

/*
 * Creates an instance. device_pref: NULL, "" or "auto" for device 0, or a
 * decimal device index as the driver numbers devices after CUDA_VISIBLE_DEVICES.
 * The CUDA backend selects the device (the runtime's primary context, the one
 * PyTorch and CuPy use, so their device pointers are valid here), forces context
 * creation and creates the instance's own stream, under a process-wide lock.
 * Returns NULL on failure; the reason is then in cuplug_backend_last_create_error().
 */
CUPLUG_API cuplug_backend* cuplug_backend_create(const char* device_pref);
CUPLUG_API int cuplug_backend_last_create_error(char* buf, int len);

/*
 * Writes one JSON object describing the instance: "backend", "variant", "abi",
 * "driver_version", "runtime_version", "device" {"type" ("cpu"|"cuda"), "index",
 * "name", "capability", "memory_free", "memory_total", "temperature_c"|null},
 * "stream" (the instance stream's handle as an integer; 0 on the CPU), "sass",
 * "ptx" (targets compiled in) and "ops" (the signatures, see cuplug_ops.h). Runs a
 * smoke kernel first, so a missing kernel image fails here
 * (CUPLUG_E_NO_KERNEL_IMAGE), not in the user's work. Returns the length needed.
 */
CUPLUG_API int cuplug_backend_ping(cuplug_backend* h, char* buf, int len);

/*
 * Runs `op` on n_in input and n_out output tensors with n_attrs attributes.
 * Inputs are only read and outputs only written during the work the call
 * queues; the backend keeps no pointer after it.
 *  - Device tensors (CUPLUG_DEVICE_CUDA) must be on the instance's device and
 *    context: checked before any launch (CUPLUG_E_WRONG_DEVICE, never an illegal
 *    address). Host tensors (CPU, CUDA host) are staged through backend-owned
 *    pinned memory, chunk-pipelined for elementwise ops; a call with host tensors
 *    returns when the outputs are written.
 *  - Tensors must be C-contiguous (strides NULL or the C-contiguous ones).
 *  - stream: 0 = the instance's own stream; otherwise a stream of the caller on
 *    the same device (a cudaStream_t as an integer), used for device tensors.
 *    Device work is asynchronous on that stream.
 * Checks the call against the op's signature (dtypes, shapes, attributes, size
 * rules) before any work; an op may set its own message (cuplug_op_fail).
 */
CUPLUG_API int cuplug_backend_call(cuplug_backend* h, const char* op,
                                   const cuplug_tensor* in, int n_in,
                                   cuplug_tensor* out, int n_out,
                                   const cuplug_attr* attrs, int n_attrs,
                                   uint64_t stream);

/*
 * Makes stream `waiter` wait for the work queued so far on stream `signaler`
 * (0 = the instance's stream, either side) without blocking the host: how the
 * loader orders a caller's stream after the instance's work and the reverse
 * (the DLPack stream handshake). A no-op on the CPU.
 */
CUPLUG_API int cuplug_backend_stream_wait(cuplug_backend* h, uint64_t waiter, uint64_t signaler);

/*
 * Resident tensors, owned by the backend (device memory on CUDA, host memory on
 * the CPU), so chained work does not cross PCIe each time.
 *  - alloc returns an id > 0 or a negative cuplug_status; contents undefined.
 *  - upload/download copy `nbytes` (the tensor's whole size) from/to host memory
 *    and wait for the instance stream's earlier work.
 *  - tensor() fills `out` with the tensor's descriptor, data pointer included
 *    (shape points into backend memory valid until free), so the caller can pass
 *    it to call() or export it (DLPack, __cuda_array_interface__).
 *  - free() waits for the instance stream's work that may still use it.
 * An id is (generation << 32 | slot): slots are reused, a freed or foreign id
 * never matches (CUPLUG_E_BAD_BUFFER).
 */
CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, cuplug_dtype dtype, int ndim, const int64_t* shape);
CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id, const void* host, long long nbytes);
CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id, void* host, long long nbytes);
CUPLUG_API int cuplug_backend_tensor(cuplug_backend* h, long long id, cuplug_tensor* out);
CUPLUG_API int cuplug_backend_free(cuplug_backend* h, long long id);

/* Waits for all work queued on the instance's stream. */
CUPLUG_API int cuplug_backend_sync(cuplug_backend* h);

/* The instance's private copy of its last error message ("" if none). */
CUPLUG_API int cuplug_backend_last_error(cuplug_backend* h, char* buf, int len);

/* Frees every resident tensor and the stream; h must not be used afterwards. NULL is a no-op. */
CUPLUG_API void cuplug_backend_destroy(cuplug_backend* h);

#ifdef __cplusplus
}
#endif

#endif /* CUPLUG_BACKEND_H */
