// The whole C ABI (v2, cuplug/backend.h) of a CUDA backend around a table
// `cuplug_ops` (see cuplug_ops.h). Include it once, at the end of the backend's
// .cu file, after the table.
//
// What it does for every backend:
//  - create(): device selection and context creation (the runtime's primary
//    context) under a process-wide lock; one non-blocking stream per instance.
//    Nothing else: staging memory, events and scratch are made on first use.
//  - ping(): a smoke launch (a missing kernel image shows there, not in the
//    user's work), then the JSON of backend.h, as long as it needs to be.
//  - call(): the op's signature check (cuplug_check_call), then device checks
//    before any launch, then one of three paths:
//      * all operands CUDA tensors: launched on the caller's stream (or the
//        instance's for stream 0), asynchronously. Each pointer must be device
//        (or managed) memory of the instance's device and, for device memory,
//        of the instance's context (a pointer of another context on the same
//        device, e.g. from cuCtxCreate, is refused: CUPLUG_E_WRONG_DEVICE), and
//        the tensor must lie inside its allocation.
//      * all operands host tensors (CPU or CUDA-host): staged through
//        backend-owned pinned memory (never a caller pointer handed to the DMA
//        engine) by several CPU threads. An elementwise op runs chunk by chunk
//        (upload, kernel, download overlap); any other op gets whole inputs in
//        instance-owned device arrays. The call returns when the outputs are
//        written.
//      * a mix of host and device operands is refused (CUPLUG_E_INVALID_ARGUMENT):
//        the simplest rule that is always right; the caller moves one side.
//  - stream_wait(): an event recorded on one stream, waited for on the other.
//  - resident tensors in device memory, ids from the shared generation-checked
//    table (cuplug_common.h); upload/download through the pinned stagers.
//  - a private copy of the last error per instance (never cudaGetLastError's
//    sticky state).
//  - fork(): the child re-initializes the process-wide lock; an instance
//    inherited from the parent refuses every call (CUDA cannot be used in a
//    forked child) instead of touching its CUDA objects or its locks.
//
// Only the static CUDA runtime is linked. The driver entry points used for the
// context check come through cudaGetDriverEntryPoint*, never a libcuda link.
#ifndef CUPLUG_CUDA_BACKEND_CUH
#define CUPLUG_CUDA_BACKEND_CUH

#include <cuda.h>  // driver API types and enum values only: nothing of libcuda is linked
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cuplug_common.h"
#include "cuplug_ops.h"
#include "cuplug_signature.h"

#ifndef CUPLUG_VARIANT
#define CUPLUG_VARIANT "unknown"
#endif
#ifndef CUPLUG_SASS_LIST
#define CUPLUG_SASS_LIST ""
#endif
#ifndef CUPLUG_PTX_LIST
#define CUPLUG_PTX_LIST ""
#endif
#ifdef CUPLUG_LTO_LIST
// cuplug_lto_image.cpp (linked into LTO variants): the SM of the image linked at load, 0 for the built one.
extern "C" __attribute__((visibility("hidden"))) int cuplug_lto_linked_arch;
#endif

// A named namespace, not an anonymous one: cudafe++ names anonymous namespaces
// with a random per-compile id, which made two clean builds differ.
namespace cuplug_cuda {

constexpr int kOpCount = CUPLUG_OP_COUNT(cuplug_ops);
constexpr int kMaxArgs = CUPLUG_MAX_ARGS;
// Host tensors move in chunks through pinned staging. One CPU thread's memcpy
// into pinned memory runs at ~10 GB/s, well below PCIe 5; so up to kMaxStagers
// threads pipeline chunks (each its own stream and two chunk slots), taking the
// next chunk from a shared counter (a slow or descheduled thread takes fewer,
// instead of holding up the call with a fixed share), and elementwise ops run
// per chunk, so H2D, kernel and D2H overlap. The defaults are what the H200
// machine chose (docs/performance.md); CUPLUG_STAGING overrides them.
constexpr size_t kDefaultChunkBytes = size_t(2) << 20;
constexpr size_t kChunkAlign = size_t(64) << 10;  // chunk sizes: multiples of 64 KiB (offsets stay 16-byte aligned)
constexpr size_t kMaxChunkBytes = size_t(64) << 20;
constexpr int kMaxStagers = 16;
constexpr int kDefaultMaxStagers = 16;
constexpr size_t kMinBytesPerStager = size_t(16) << 20;  // below this, threads cost more than they give
constexpr size_t kDeviceAlign = 256;                     // operand regions in the host-path device arrays

// Microseconds on the monotonic clock (the start-up timings in the ping JSON).
inline long long now_us() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

// No libstdc++ types here (pthread, not std::mutex): with the old-glibc sysroot the
// library then needs only GLIBCXX symbols that manylinux2014 allows.
pthread_mutex_t g_create_lock = PTHREAD_MUTEX_INITIALIZER;  // device selection + context creation
// Bumped in the child after every fork(): an instance made before compares unequal.
volatile unsigned g_fork_generation = 0;
thread_local char g_create_error[CUPLUG_ERR_LEN];

void nvml_atfork_child();

void atfork_child() {
  // The parent may have held the lock in another thread; that thread does not exist here.
  pthread_mutex_init(&g_create_lock, nullptr);
  g_fork_generation = g_fork_generation + 1;
  nvml_atfork_child();
}
// At load (glibc drops the handler again when the library is dlclose()d).
__attribute__((constructor)) void register_atfork() { pthread_atfork(nullptr, nullptr, atfork_child); }

struct Guard {
  pthread_mutex_t* m;
  explicit Guard(pthread_mutex_t* mutex) : m(mutex) { pthread_mutex_lock(m); }
  ~Guard() { pthread_mutex_unlock(m); }
};

__global__ void smoke_kernel(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = 1.0f;
}

int status_of(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return CUPLUG_OK;
    case cudaErrorMemoryAllocation: return CUPLUG_E_OUT_OF_MEMORY;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInvalidPtx:
      return CUPLUG_E_NO_KERNEL_IMAGE;
    default: return CUPLUG_E_DEVICE;
  }
}

// ---- driver entry points (resolved through the runtime; no libcuda link) ---------
struct DriverApi {
  CUresult (*pointer_get_attributes)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*device_get_name)(char*, int, CUdevice);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
};
DriverApi g_driver;
bool g_driver_resolved = false;  // under g_create_lock (not pthread_once: GLIBC_2.34 when linked on a new host)

void* driver_symbol(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
#else
  cudaError_t err = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
}

void resolve_driver() {
  g_driver.pointer_get_attributes =
      reinterpret_cast<CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr)>(
          driver_symbol("cuPointerGetAttributes"));
  g_driver.ctx_get_current = reinterpret_cast<CUresult (*)(CUcontext*)>(driver_symbol("cuCtxGetCurrent"));
  g_driver.device_get = reinterpret_cast<CUresult (*)(CUdevice*, int)>(driver_symbol("cuDeviceGet"));
  g_driver.device_get_name = reinterpret_cast<CUresult (*)(char*, int, CUdevice)>(driver_symbol("cuDeviceGetName"));
  g_driver.primary_ctx_retain =
      reinterpret_cast<CUresult (*)(CUcontext*, CUdevice)>(driver_symbol("cuDevicePrimaryCtxRetain"));
}

// One reference to each used device's primary context, held for the life of the process
// (under g_create_lock). The runtime holds its own all along, so nothing changes while the
// process runs; at exit the static runtime's teardown then releases its reference without
// destroying the context, which the driver reclaims with the process, as it does for a
// program that uses the driver API alone (the "context floor" of docs/performance.md).
unsigned long long g_primary_kept = 0;  // bit d: device d (d < 64)

void keep_primary_context(int device) {
  if (device < 0 || device >= 64 || (g_primary_kept >> device & 1ULL) || !g_driver.primary_ctx_retain ||
      !g_driver.device_get)
    return;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (g_driver.device_get(&dev, device) == CUDA_SUCCESS && g_driver.primary_ctx_retain(&ctx, dev) == CUDA_SUCCESS)
    g_primary_kept |= 1ULL << device;
}

// The device's name through the driver (cudaGetDeviceProperties would read ~100 attributes for it).
void device_name(int device, char* buf, int len) {
  CUdevice dev = 0;
  buf[0] = '\0';
  if (g_driver.device_get && g_driver.device_get_name && g_driver.device_get(&dev, device) == CUDA_SUCCESS &&
      g_driver.device_get_name(buf, len - 1, dev) == CUDA_SUCCESS) {
    buf[len - 1] = '\0';
    return;
  }
  cudaDeviceProp props;  // no driver entry points: the runtime's way
  if (cudaGetDeviceProperties(&props, device) == cudaSuccess) {
    snprintf(buf, (size_t)len, "%.*s", (int)sizeof props.name, props.name);
  } else {
    cudaGetLastError();
  }
}

// Temperature through NVML, opened at run time only if the driver ships it
// (the backend links nothing but the static CUDA runtime). nvmlInit and the first
// handle lookup take 20-30 ms on the H200 machine, so the first ping of an
// instance (the one load() makes, right after create) does not read it and
// reports null; every later ping does (NVML is initialised once per process).
struct Nvml {
  pthread_mutex_t lock;
  bool tried;
  bool ready;
  int (*by_bus)(const char*, void**);
  int (*temp)(void*, int, unsigned*);
  long long init_us;  // how long dlopen + nvmlInit took
};
Nvml g_nvml = {PTHREAD_MUTEX_INITIALIZER, false, false, nullptr, nullptr, 0};

void nvml_atfork_child() { pthread_mutex_init(&g_nvml.lock, nullptr); }

bool nvml_ready() {
  Guard guard(&g_nvml.lock);
  if (!g_nvml.tried) {
    g_nvml.tried = true;
    const long long t0 = now_us();
    if (void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
      auto init = reinterpret_cast<int (*)()>(dlsym(nvml, "nvmlInit_v2"));
      g_nvml.by_bus = reinterpret_cast<int (*)(const char*, void**)>(dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2"));
      g_nvml.temp = reinterpret_cast<int (*)(void*, int, unsigned*)>(dlsym(nvml, "nvmlDeviceGetTemperature"));
      g_nvml.ready = init != nullptr && g_nvml.by_bus != nullptr && g_nvml.temp != nullptr && init() == 0;
    }
    g_nvml.init_us = now_us() - t0;
  }
  return g_nvml.ready;
}

int read_temperature_c(int device) {
  if (!nvml_ready()) return -1;
  char bus[32];
  void* handle = nullptr;
  unsigned t = 0;
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  if (g_nvml.by_bus(bus, &handle) != 0 || g_nvml.temp(handle, 0 /* NVML_TEMPERATURE_GPU */, &t) != 0) return -1;
  return (int)t;
}

// Buffers per staging slot: the most operands (inputs + outputs) of any op, at
// least one (plain uploads and downloads use one).
int slot_buffers() {
  int most = 1;
  for (int i = 0; i < kOpCount; ++i)
    most = std::max(most, cuplug_op_n_inputs(&cuplug_ops[i]) + cuplug_op_n_outputs(&cuplug_ops[i]));
  return most;
}

// One host-path pipeline: a stream and two slots. Slot k has slot_buffers()
// chunk buffers of chunk_bytes in pinned memory, and as many in device memory
// for elementwise ops (made on their first use).
struct Stager {
  cudaStream_t stream;
  char* pinned[2];
  char* device[2];
  cudaEvent_t slot_free[2];
};

// How the host path stages, read once at create:
//   CUPLUG_STAGING_THREADS=<1..16>   the most staging threads (default min(16, CPUs))
//   CUPLUG_STAGING=threads=<n>,chunk_kb=<k>,copy=stream|memcpy,schedule=dynamic|static
// (any subset, comma-separated; unknown keys and bad values are ignored). chunk_kb is
// rounded down to a multiple of 64 (64 KiB .. 64 MiB); copy=stream moves bytes between
// the caller's arrays and pinned memory with non-temporal stores (no read-for-ownership
// of the destination, no cache pollution), memcpy with the C library's memcpy;
// schedule=dynamic hands out chunks from a shared counter, static gives each thread one
// contiguous share (the 2026-12-03 design).
struct StagingConfig {
  int threads;
  size_t chunk_bytes;
  bool stream_copy;
  bool dynamic;
};

inline bool has_stream_copy() {
#if defined(__SSE2__)
  return true;
#else
  return false;
#endif
}

StagingConfig staging_from_env() {
  StagingConfig c;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  // One per CPU, up to 16: the copies into and out of pinned memory are bound by the host's memory
  // bandwidth per thread (the H200 machine's 16 CPUs: 8 threads 0.72-0.77x the pinned copy, 12
  // threads 0.85-0.91x, 16 threads 0.97x; docs/performance.md).
  c.threads = (int)std::max(1L, std::min((long)kDefaultMaxStagers, cpus));
  c.chunk_bytes = kDefaultChunkBytes;
  c.stream_copy = has_stream_copy();
  c.dynamic = true;
  if (const char* v = getenv("CUPLUG_STAGING_THREADS")) {
    long want = strtol(v, nullptr, 10);
    if (want >= 1) c.threads = (int)std::min((long)kMaxStagers, want);
  }
  const char* spec = getenv("CUPLUG_STAGING");
  if (spec == nullptr) return c;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", spec);
  char* save = nullptr;
  for (char* item = strtok_r(buf, ",", &save); item != nullptr; item = strtok_r(nullptr, ",", &save)) {
    char* eq = strchr(item, '=');
    if (eq == nullptr) continue;
    *eq = '\0';
    const char* key = item;
    const char* val = eq + 1;
    if (strcmp(key, "threads") == 0) {
      long want = strtol(val, nullptr, 10);
      if (want >= 1) c.threads = (int)std::min((long)kMaxStagers, want);
    } else if (strcmp(key, "chunk_kb") == 0) {
      long long kb = strtoll(val, nullptr, 10);
      size_t bytes = kb > 0 ? (size_t)kb << 10 : 0;
      bytes = std::min(bytes, kMaxChunkBytes) / kChunkAlign * kChunkAlign;
      if (bytes > 0) c.chunk_bytes = bytes;
    } else if (strcmp(key, "copy") == 0) {
      if (strcmp(val, "memcpy") == 0) c.stream_copy = false;
      if (strcmp(val, "stream") == 0) c.stream_copy = has_stream_copy();
    } else if (strcmp(key, "schedule") == 0) {
      if (strcmp(val, "static") == 0) c.dynamic = false;
      if (strcmp(val, "dynamic") == 0) c.dynamic = true;
    }
  }
  return c;
}

// Copies between a caller's array and pinned staging memory. With stream=true
// (x86-64: SSE2 is part of the base ISA) the destination is written with
// non-temporal 16-byte stores: the bytes go to DRAM without first reading the
// destination lines into the cache, about a third less memory traffic for a copy
// much larger than the caches, which is what the host path is. The sfence makes
// the stores visible before the copy engine is told to read them.
void stage_copy(void* dst, const void* src, size_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream && bytes >= 256) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    const size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    const size_t body = bytes & ~size_t(63);
    for (size_t i = 0; i < body; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    memcpy(d + body, s + body, bytes - body);
    _mm_sfence();
    return;
  }
#else
  (void)stream;
#endif
  memcpy(dst, src, bytes);
}

}  // namespace cuplug_cuda

// Allocated with calloc: every member starts zero/NULL.
struct cuplug_backend {
  pthread_mutex_t lock;  // serializes calls on one instance
  unsigned fork_generation;  // g_fork_generation at create
  int device;
  int sm_count;
  CUcontext context;  // the context the runtime uses for `device` (its primary context); NULL if unknown
  int cc_major, cc_minor;  // read at create (two attributes; cudaGetDeviceProperties reads ~100)
  cudaStream_t stream;
  cudaEvent_t wait_event;  // stream_wait(), made on first use
  cuplug_tensor_table tensors;
  cuplug_cuda::Stager stagers[cuplug_cuda::kMaxStagers];  // host-path pipelines, made on first use
  cuplug_cuda::StagingConfig staging;
  int slot_buffers;
  // Where the start-up time went (microseconds), reported in the ping JSON as "startup_us".
  long long t_runtime_us, t_context_us, t_create_rest_us;  // create(): runtime init, context, the rest
  long long t_smoke_us, t_facts_us, t_nvml_us;  // the first ping
  bool pinged;
  char* host_arrays;  // device arrays of a non-elementwise op's host operands
  size_t host_arrays_bytes;
  // cuplug_cuda_scratch(): one block, grown on demand. Its last user's stream
  // recorded scratch_event, so a call on another stream waits for it first.
  void* op_scratch;
  size_t op_scratch_bytes;
  cudaEvent_t scratch_event;
  bool scratch_recorded;  // scratch_event marks the last use
  unsigned long long scratch_stream_id;  // cudaStreamGetId of that use's stream (ids are never reused); 0 unknown
  unsigned long long scratch_next_id;    // the running op's stream id, recorded with the event after it
  bool scratch_taken;     // the running op asked for scratch: record after it
  void* capture_scratch;  // scratch of an op being captured into a CUDA graph: the graph's own, freed after it
  char last_error[CUPLUG_ERR_LEN];

#if defined(__GNUC__)
  __attribute__((format(printf, 3, 4)))
#endif
  int fail(int code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cuplug_vformat(last_error, fmt, ap);
    va_end(ap);
    return code;
  }
  // Records a CUDA error with the step that failed and clears the runtime's
  // non-sticky error state, so the instance stays usable after e.g. an OOM.
  int check(cudaError_t err, const char* step) {
    if (err == cudaSuccess) return CUPLUG_OK;
    cudaGetLastError();
    return fail(cuplug_cuda::status_of(err), "%s: %s (%s)", step, cudaGetErrorName(err), cudaGetErrorString(err));
  }
  bool forked() const { return fork_generation != cuplug_cuda::g_fork_generation; }
};

#define CUPLUG_TRY(expr, step)          \
  do {                                  \
    int rc_ = h->check((expr), (step)); \
    if (rc_ != CUPLUG_OK) return rc_;   \
  } while (0)

// Temporary device memory for an op that is not elementwise (e.g. per-block
// partials of a reduction), kept by the instance and grown on demand; NULL when
// the device is out of memory. Zero-filled when (re)allocated: an op that
// needs zeros on entry (a ticket counter) must leave them zero when it ends.
// Ordered across streams: the framework records an event after the op, and a
// later call on another stream waits for it before its own use. Not for
// elementwise ops (they run from several staging threads at once).
void* cuplug_cuda_scratch(const cuplug_call* call, size_t bytes) {
  cuplug_backend* h = static_cast<cuplug_backend*>(call->backend);
  cudaStream_t stream = static_cast<cudaStream_t>(call->stream);
  // Under CUDA graph capture the instance's block cannot serve: a replay runs whenever the caller likes, beside
  // eager calls that use the block, and a wait on an event recorded outside the capture invalidates it. The
  // captured op gets memory of the graph's own (a memory node: cudaMallocAsync on the capturing stream, zeroed,
  // freed by call_op right after the op), so every replay has it to itself.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess) {
    cudaGetLastError();
    capturing = cudaStreamCaptureStatusNone;
  }
  if (capturing == cudaStreamCaptureStatusActive) {
    void* p = nullptr;
    if (h->capture_scratch != nullptr || cudaMallocAsync(&p, bytes > 0 ? bytes : 1, stream) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    if (cudaMemsetAsync(p, 0, bytes > 0 ? bytes : 1, stream) != cudaSuccess) {
      cudaGetLastError();
      cudaFreeAsync(p, stream);
      return nullptr;
    }
    h->capture_scratch = p;
    return p;
  }
  unsigned long long sid = 0;  // a process-unique id: a new stream that reuses a destroyed one's handle differs
  if (cudaStreamGetId(stream, &sid) != cudaSuccess) {
    cudaGetLastError();
    sid = 0;
  }
  if (h->scratch_event == nullptr &&
      cudaEventCreateWithFlags(&h->scratch_event, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    h->scratch_event = nullptr;
    return nullptr;
  }
  if (h->op_scratch_bytes < bytes) {
    // Every earlier use, on whatever stream, is done before the old block goes.
    if (h->scratch_recorded && cudaEventSynchronize(h->scratch_event) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    if (h->op_scratch) cudaFree(h->op_scratch);
    h->op_scratch = nullptr;
    h->op_scratch_bytes = 0;
    h->scratch_recorded = false;
    size_t size = std::max(bytes, size_t(64) << 10);
    if (cudaMalloc(&h->op_scratch, size) != cudaSuccess) {
      cudaGetLastError();
      h->op_scratch = nullptr;
      return nullptr;
    }
    if (cudaMemsetAsync(h->op_scratch, 0, size, stream) != cudaSuccess) {
      cudaGetLastError();
      cudaFree(h->op_scratch);
      h->op_scratch = nullptr;
      return nullptr;
    }
    h->op_scratch_bytes = size;
  } else if (h->scratch_recorded && (sid == 0 || sid != h->scratch_stream_id) &&
             cudaStreamWaitEvent(stream, h->scratch_event, 0) != cudaSuccess) {
    // On the stream of the last use, stream order already puts this op after it: no wait
    // (a wait on an event of the same stream still costs the GPU a few microseconds per call).
    cudaGetLastError();
    return nullptr;
  }
  h->scratch_next_id = sid;
  h->scratch_taken = true;
  return h->op_scratch;
}

namespace cuplug_cuda {

// ---- running one op ------------------------------------------------------------

// Runs `op` on device tensors on `stream`. A failure carries the op's own
// message (cuplug_op_fail) or the CUDA error of its launch, into (error, len).
int call_op(cuplug_backend* h, const cuplug_op* op, const cuplug_tensor* in, int n_in, cuplug_tensor* out, int n_out,
            const cuplug_attr* attrs, cudaStream_t stream, char* error, size_t error_len) {
  char op_error[CUPLUG_ERR_LEN];
  op_error[0] = '\0';
  cuplug_call call;
  memset(&call, 0, sizeof call);
  call.op = op;
  call.in = in;
  call.n_in = n_in;
  call.out = out;
  call.n_out = n_out;
  call.attrs = attrs;
  call.n_attrs = cuplug_op_n_attrs(op);
  call.n = n_in > 0 ? cuplug_numel(&in[0]) : 0;
  call.stream = stream;
  call.sm_count = h->sm_count;
  call.backend = h;
  call.error = op_error;
  call.error_len = sizeof op_error;
  cudaGetLastError();  // a stale error of someone else's must not be blamed on this op
  int rc = op->fn(&call);
  cudaError_t launch = cudaGetLastError();
  if (h->capture_scratch != nullptr) {  // a captured op's own scratch: freed in the graph, after the op
    cudaError_t e = cudaFreeAsync(h->capture_scratch, stream);
    h->capture_scratch = nullptr;
    if (e != cudaSuccess && launch == cudaSuccess) launch = e;
    cudaGetLastError();
  }
  if (h->scratch_taken) {  // the scratch's next user (maybe on another stream) waits for this op
    h->scratch_taken = false;
    cudaError_t e = cudaEventRecord(h->scratch_event, stream);
    h->scratch_recorded = e == cudaSuccess;
    h->scratch_stream_id = h->scratch_next_id;
    if (e != cudaSuccess && launch == cudaSuccess) launch = e;
    cudaGetLastError();
  }
  if (rc == CUPLUG_OK && launch == cudaSuccess) return CUPLUG_OK;
  if (rc > 0 || rc < CUPLUG_E_WRONG_DEVICE) rc = CUPLUG_E_INVALID_ARGUMENT;  // not a cuplug status
  if (launch != cudaSuccess) {
    snprintf(error, error_len, "%s: kernel launch failed: %s (%s)", op->name, cudaGetErrorName(launch),
             cudaGetErrorString(launch));
    return status_of(launch);
  }
  if (op_error[0] != '\0')
    snprintf(error, error_len, "%s", op_error);
  else if (rc == CUPLUG_E_OUT_OF_MEMORY)
    snprintf(error, error_len, "%s: out of device memory (scratch)", op->name);
  else
    snprintf(error, error_len, "%s failed (status %d)", op->name, rc);
  return rc;
}

// Copies of tensors with byte_offset folded into data, strides NULL (the
// signature check found them C-contiguous).
void fold(const cuplug_tensor* src, cuplug_tensor* dst, int n) {
  for (int k = 0; k < n; ++k) {
    dst[k] = src[k];
    if (dst[k].data != nullptr) dst[k].data = static_cast<char*>(dst[k].data) + dst[k].byte_offset;
    dst[k].byte_offset = 0;
    dst[k].strides = nullptr;
  }
}

long long tensor_bytes(const cuplug_tensor& t) { return cuplug_numel(&t) * cuplug_dtype_size(t.dtype); }

// ---- device checks -------------------------------------------------------------

const char* device_type_name(int type) {
  switch (type) {
    case CUPLUG_DEVICE_CPU: return "cpu";
    case CUPLUG_DEVICE_CUDA: return "cuda";
    case CUPLUG_DEVICE_CUDA_HOST: return "cuda_host";
    default: return "unknown";
  }
}

// check_device_tensor through one driver query of six attributes (0.09 us a tensor on the H200, against 0.19
// for the runtime's cudaPointerGetAttributes and the driver's three beside it: bench/cuda_call_costs.cu):
// the same checks and messages. cuPointerGetAttributes answers every pointer (a foreign one with memory
// type 0), so an error of its own is the driver's and is reported as such.
int check_device_pointer(cuplug_backend* h, const char* op, const char* what, const cuplug_tensor& t, long long bytes) {
  const int dev = h->device;
  unsigned type = 0, managed = 0;
  int ordinal = -1;
  CUcontext ctx = nullptr;
  CUdeviceptr start = 0;
  size_t size = 0;
  CUpointer_attribute which[6] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT,
                                  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* values[6] = {&type, &managed, &ordinal, &ctx, &start, &size};
  CUresult r = g_driver.pointer_get_attributes(6, which, values, (CUdeviceptr)(uintptr_t)t.data);
  if (r != CUDA_SUCCESS)
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s (declared cuda:%d) points at %p, which the CUDA driver could not describe (CUresult %d); "
                   "pass device memory of cuda:%d, or host memory as a CPU tensor",
                   op, what, dev, t.data, (int)r, dev);
  if (type == 0)
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s is declared a cuda:%d tensor, but %p is not CUDA memory (a host pointer?); pass host "
                   "memory with device_type CPU, or copy the tensor to cuda:%d",
                   op, what, dev, t.data, dev);
  if (type == CU_MEMORYTYPE_HOST && !managed)
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s is declared a cuda:%d tensor, but %p is pinned host memory; pass it with device_type "
                   "CUDA_HOST (kDLCUDAHost) or CPU, or copy it to cuda:%d",
                   op, what, dev, t.data, dev);
  if (ordinal != dev)
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s says cuda:%d, but its memory %p belongs to cuda:%d, and this backend instance runs on "
                   "cuda:%d; copy the tensor to cuda:%d or use an instance created for device %d",
                   op, what, (int)t.device_id, t.data, ordinal, dev, dev, ordinal);
  // Managed memory is valid in every context; device memory only in its own.
  // (Memory of the virtual memory API, cuMemCreate/cuMemMap, has no context: NULL.)
  if (!managed && ctx != nullptr && h->context != nullptr && ctx != h->context)
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s (%p) is memory of another CUDA context on cuda:%d, not of the runtime's primary context "
                   "that this backend (like PyTorch and CuPy) uses; allocate it in the primary context (cudaMalloc, "
                   "torch, cupy) or copy it there first",
                   op, what, t.data, dev);
  const uintptr_t p = (uintptr_t)t.data, base = (uintptr_t)start;
  if (size > 0 && (p < base || p - base > size || (unsigned long long)bytes > size - (p - base)))
    return h->fail(CUPLUG_E_INVALID_ARGUMENT,
                   "%s: %s needs %lld bytes at %p, but its allocation is %zu bytes at %p: the tensor runs past "
                   "the end of its memory",
                   op, what, bytes, t.data, size, (void*)(uintptr_t)start);
  return CUPLUG_OK;
}

// A CUDA tensor's memory (already folded) must be device or managed memory of
// h->device, device memory of h's context, and [p, p + bytes) inside its
// allocation. All before any launch: a clear error, never an illegal address.
int check_device_tensor(cuplug_backend* h, const char* op, const char* what, const cuplug_tensor& t) {
  const long long bytes = tensor_bytes(t);
  if (bytes == 0) return CUPLUG_OK;  // nothing is read or written
  const int dev = h->device;
  if (t.device_id != dev)
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s is a tensor on cuda:%d, but this backend instance runs on cuda:%d; move it there "
                   "(tensor.to('cuda:%d')) or use an instance created for device %d",
                   op, what, (int)t.device_id, dev, dev, (int)t.device_id);
  if (g_driver.pointer_get_attributes != nullptr) return check_device_pointer(h, op, what, t, bytes);
  cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  cudaError_t err = cudaPointerGetAttributes(&a, t.data);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s (declared cuda:%d) points at %p, which the CUDA runtime does not know as device memory "
                   "(%s); pass device memory of cuda:%d, or host memory as a CPU tensor",
                   op, what, dev, t.data, cudaGetErrorName(err), dev);
  }
  if (a.type == cudaMemoryTypeUnregistered)
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s is declared a cuda:%d tensor, but %p is not CUDA memory (a host pointer?); pass host "
                   "memory with device_type CPU, or copy the tensor to cuda:%d",
                   op, what, dev, t.data, dev);
  if (a.type == cudaMemoryTypeHost)
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s is declared a cuda:%d tensor, but %p is pinned host memory; pass it with device_type "
                   "CUDA_HOST (kDLCUDAHost) or CPU, or copy it to cuda:%d",
                   op, what, dev, t.data, dev);
  if (a.device != dev)
    return h->fail(CUPLUG_E_WRONG_DEVICE,
                   "%s: %s says cuda:%d, but its memory %p belongs to cuda:%d, and this backend instance runs on "
                   "cuda:%d; copy the tensor to cuda:%d or use an instance created for device %d",
                   op, what, (int)t.device_id, t.data, a.device, dev, dev, a.device);
  return CUPLUG_OK;  // no driver entry point for the context and range: as far as the runtime can see
}

// ---- host staging --------------------------------------------------------------

int ensure_host_arrays(cuplug_backend* h, size_t bytes) {
  if (h->host_arrays_bytes >= bytes) return CUPLUG_OK;
  if (h->host_arrays) cudaFree(h->host_arrays);
  h->host_arrays = nullptr;
  h->host_arrays_bytes = 0;
  CUPLUG_TRY(cudaMalloc(&h->host_arrays, bytes), "cudaMalloc(host-path device arrays)");
  h->host_arrays_bytes = bytes;
  return CUPLUG_OK;
}

int ensure_stager(cuplug_backend* h, int i, bool device_buffers) {
  Stager* st = &h->stagers[i];
  const size_t slot = (size_t)h->slot_buffers * h->staging.chunk_bytes;
  for (int k = 0; k < 2; ++k) {  // after a failed attempt, keep what was made (release() frees it)
    if (!st->pinned[k]) CUPLUG_TRY(cudaMallocHost(&st->pinned[k], slot), "cudaMallocHost(staging)");
    if (!st->slot_free[k])
      CUPLUG_TRY(cudaEventCreateWithFlags(&st->slot_free[k], cudaEventDisableTiming), "cudaEventCreate(staging)");
    if (device_buffers && !st->device[k])
      CUPLUG_TRY(cudaMalloc(&st->device[k], slot), "cudaMalloc(staging chunks)");
  }
  if (!st->stream)
    CUPLUG_TRY(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate(staging)");
  return CUPLUG_OK;
}

// What one stager does with the chunks it takes (chunk c = elements
// [c * chunk, min(n, (c + 1) * chunk))):
//  - op == NULL: plain copies, host hin[i] -> device din[i] (upload) and device
//    dsrc[j] -> host hout[j] (download), element sizes isz / osz;
//  - op != NULL (elementwise): per chunk, upload the inputs into the slot's
//    device chunk buffers, run the op there on 1-D chunk tensors, download
//    its outputs.
// Dynamic schedule: chunks from the shared counter *next until *next >= chunks
// (or another stager failed); static: chunks [first, last) of its own.
struct StageJob {
  cuplug_backend* h;
  Stager* st;
  int nin, nout;
  const char* hin[kMaxArgs];
  char* hout[kMaxArgs];
  char* din[kMaxArgs];
  const char* dsrc[kMaxArgs];
  size_t isz[kMaxArgs], osz[kMaxArgs];
  const cuplug_op* op;
  const cuplug_tensor* in_t;  // the caller's tensors (dtypes), op != NULL
  const cuplug_tensor* out_t;
  const cuplug_attr* attrs;
  long long n;       // elements in all
  long long chunk;   // elements per chunk
  long long chunks;  // chunks in all
  long long* next;   // dynamic: the shared counter; NULL: static
  int* failed;       // set by the first stager that fails: the others stop taking chunks
  long long first, last;  // static: this stager's chunks
  size_t slot_stride;     // bytes between the buffers of one slot (the chunk size in bytes)
  bool stream_copy;
  int rc;
  char error[CUPLUG_ERR_LEN];
};

int stage_fail(StageJob* j, cudaError_t err, const char* step) {
  cudaGetLastError();
  snprintf(j->error, sizeof j->error, "%s: %s (%s)", step, cudaGetErrorName(err), cudaGetErrorString(err));
  return j->rc = status_of(err);
}

#define CUPLUG_STAGE_TRY(expr, step)                         \
  do {                                                       \
    cudaError_t e_ = (expr);                                 \
    if (e_ != cudaSuccess) return stage_fail(j, e_, (step)); \
  } while (0)

int stage_range_inner(StageJob* j) {
  Stager* st = j->st;
  CUPLUG_STAGE_TRY(cudaSetDevice(j->h->device), "cudaSetDevice(staging)");
  const int nin = j->nin, nout = j->nout;
  const size_t stride = j->slot_stride;
  long long pending_off[2] = {0, 0}, pending_len[2] = {0, 0};  // output chunk waiting in each slot
  auto drain = [&](int slot) -> cudaError_t {
    cudaError_t e = cudaEventSynchronize(st->slot_free[slot]);
    if (e == cudaSuccess && pending_len[slot] > 0)
      for (int o = 0; o < nout; ++o)
        stage_copy(j->hout[o] + pending_off[slot] * j->osz[o], st->pinned[slot] + (size_t)(nin + o) * stride,
                   (size_t)pending_len[slot] * j->osz[o], j->stream_copy);
    pending_len[slot] = 0;
    return e;
  };
  for (long long k = 0;; ++k) {
    long long c;
    if (j->next != nullptr) {
      if (__atomic_load_n(j->failed, __ATOMIC_RELAXED)) break;
      c = __atomic_fetch_add(j->next, 1LL, __ATOMIC_RELAXED);
      if (c >= j->chunks) break;
    } else {
      c = j->first + k;
      if (c >= j->last) break;
    }
    const long long off = c * j->chunk;
    const long long len = std::min(j->chunk, j->n - off);
    const int slot = (int)(k & 1);
    CUPLUG_STAGE_TRY(drain(slot), "staging wait");
    char* pin = st->pinned[slot];
    char* dev = st->device[slot];
    for (int i = 0; i < nin; ++i) {
      const size_t bytes = (size_t)len * j->isz[i];
      stage_copy(pin + (size_t)i * stride, j->hin[i] + off * j->isz[i], bytes, j->stream_copy);
      char* dst = j->op ? dev + (size_t)i * stride : j->din[i] + off * j->isz[i];
      CUPLUG_STAGE_TRY(cudaMemcpyAsync(dst, pin + (size_t)i * stride, bytes, cudaMemcpyHostToDevice, st->stream),
                       "cudaMemcpyAsync(H2D)");
    }
    if (j->op != nullptr) {
      int64_t shape[1] = {len};
      cuplug_tensor tin[kMaxArgs], tout[kMaxArgs];
      for (int i = 0; i < nin + nout; ++i) {
        cuplug_tensor& t = i < nin ? tin[i] : tout[i - nin];
        t = i < nin ? j->in_t[i] : j->out_t[i - nin];
        t.data = dev + (size_t)i * stride;
        t.device_type = CUPLUG_DEVICE_CUDA;
        t.device_id = j->h->device;
        t.ndim = 1;
        t.shape = shape;
        t.strides = nullptr;
        t.byte_offset = 0;
      }
      int rc = call_op(j->h, j->op, tin, nin, tout, nout, j->attrs, st->stream, j->error, sizeof j->error);
      if (rc != CUPLUG_OK) return j->rc = rc;
    }
    for (int o = 0; o < nout; ++o) {
      const size_t bytes = (size_t)len * j->osz[o];
      const char* src = j->op ? dev + (size_t)(nin + o) * stride : j->dsrc[o] + off * j->osz[o];
      CUPLUG_STAGE_TRY(
          cudaMemcpyAsync(pin + (size_t)(nin + o) * stride, src, bytes, cudaMemcpyDeviceToHost, st->stream),
          "cudaMemcpyAsync(D2H)");
    }
    if (nout > 0) pending_off[slot] = off, pending_len[slot] = len;
    CUPLUG_STAGE_TRY(cudaEventRecord(st->slot_free[slot], st->stream), "cudaEventRecord(staging)");
  }
  for (int slot = 0; slot < 2; ++slot) CUPLUG_STAGE_TRY(drain(slot), "staging wait");
  CUPLUG_STAGE_TRY(cudaStreamSynchronize(st->stream), "staging sync");
  return j->rc = CUPLUG_OK;
}

// On failure too, nothing of this stager's work is still in flight when it returns
// (the next use of the slots and the caller's memory must not race with it).
int stage_range(StageJob* j) {
  int rc = stage_range_inner(j);
  if (rc != CUPLUG_OK) {
    if (j->failed) __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
    if (j->st->stream) {
      cudaStreamSynchronize(j->st->stream);
      cudaGetLastError();
    }
  }
  return rc;
}

void* stage_thread(void* job) {
  stage_range(static_cast<StageJob*>(job));
  return nullptr;
}

// Splits [0, n) elements into chunks over the stagers, runs them and waits.
// Every chunk is done (or its stager failed) when this returns; the first
// failure is recorded as the instance's error.
int stage(cuplug_backend* h, StageJob tmpl, long long n) {
  if (n <= 0) return CUPLUG_OK;
  // Work already queued on the instance's stream may read or write these arrays.
  CUPLUG_TRY(cudaStreamSynchronize(h->stream), "sync before staging");
  size_t widest = 1;
  for (int i = 0; i < tmpl.nin; ++i) widest = std::max(widest, tmpl.isz[i]);
  for (int o = 0; o < tmpl.nout; ++o) widest = std::max(widest, tmpl.osz[o]);
  const size_t chunk_bytes = h->staging.chunk_bytes;
  tmpl.chunk = (long long)(chunk_bytes / widest);  // a multiple of 16 elements (chunk_bytes: of 64 KiB)
  tmpl.n = n;
  tmpl.chunks = (n + tmpl.chunk - 1) / tmpl.chunk;
  tmpl.slot_stride = chunk_bytes;
  tmpl.stream_copy = h->staging.stream_copy;
  const long long bytes = n * (long long)widest;
  const int count = (int)std::max<long long>(
      1, std::min<long long>({(long long)h->staging.threads, bytes / (long long)kMinBytesPerStager, tmpl.chunks}));
  for (int i = 0; i < count; ++i) {
    int rc = ensure_stager(h, i, tmpl.op != nullptr);
    if (rc) return rc;
  }
  long long next = 0;
  int failed = 0;
  tmpl.next = h->staging.dynamic ? &next : nullptr;
  tmpl.failed = &failed;
  StageJob jobs[kMaxStagers];
  pthread_t threads[kMaxStagers];
  bool started[kMaxStagers] = {};
  tmpl.h = h;
  for (int i = 0; i < count; ++i) {
    jobs[i] = tmpl;
    jobs[i].st = &h->stagers[i];
    jobs[i].first = tmpl.chunks * i / count;
    jobs[i].last = tmpl.chunks * (i + 1) / count;
    jobs[i].rc = CUPLUG_OK;
    jobs[i].error[0] = '\0';
    // Stager 0 runs on the calling thread; if a thread cannot start, its share runs there too.
    started[i] = i > 0 && pthread_create(&threads[i], nullptr, stage_thread, &jobs[i]) == 0;
  }
  for (int i = 0; i < count; ++i)
    if (!started[i]) stage_range(&jobs[i]);
  for (int i = 0; i < count; ++i)
    if (started[i]) pthread_join(threads[i], nullptr);
  for (int i = 0; i < count; ++i)
    if (jobs[i].rc != CUPLUG_OK) return h->fail(jobs[i].rc, "%s", jobs[i].error);
  return CUPLUG_OK;
}

// Below this many bytes a host operand is copied as it is (pageable memory, on the instance's stream), not
// through the stagers: their pinned slots (2 x 8 MiB of cudaMallocHost) and threads cost a first small call
// milliseconds (the H100 found load()'s self-test, a few KiB per op, taking 12-22 ms, most of it there).
constexpr size_t kDirectHostBytes = size_t(1) << 20;

int upload_staged(cuplug_backend* h, void* dev, const void* host, size_t bytes) {
  if (bytes <= kDirectHostBytes)  // returns once the source is read: the caller may reuse it
    return h->check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, h->stream), "cudaMemcpyAsync(upload)");
  StageJob j;
  memset(&j, 0, sizeof j);
  j.nin = 1, j.hin[0] = static_cast<const char*>(host), j.din[0] = static_cast<char*>(dev), j.isz[0] = 1;
  return stage(h, j, (long long)bytes);
}

int download_staged(cuplug_backend* h, void* host, const void* dev, size_t bytes) {
  if (bytes <= kDirectHostBytes) {  // after the work queued on the instance's stream; written when it returns
    CUPLUG_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, h->stream), "cudaMemcpyAsync(download)");
    return h->check(cudaStreamSynchronize(h->stream), "download");
  }
  StageJob j;
  memset(&j, 0, sizeof j);
  j.nout = 1, j.dsrc[0] = static_cast<const char*>(dev), j.hout[0] = static_cast<char*>(host), j.osz[0] = 1;
  return stage(h, j, (long long)bytes);
}

// A call whose operands are all host tensors (folded). Returns when the outputs are written.
int call_host(cuplug_backend* h, const cuplug_op* op, const cuplug_tensor* in, int n_in, cuplug_tensor* out,
              int n_out, const cuplug_attr* attrs) {
  const long long n = n_in > 0 ? cuplug_numel(&in[0]) : 0;
  if (op->flags & CUPLUG_ELEMENTWISE) {  // chunk by chunk, so uploads, kernels and downloads overlap
    for (int k = 0; k < n_in + n_out; ++k) {
      const cuplug_tensor& t = k < n_in ? in[k] : out[k - n_in];
      if (cuplug_numel(&t) != n)
        return h->fail(CUPLUG_E_INVALID_ARGUMENT,
                       "%s: elementwise op with operands of different sizes (%s has %lld elements, %s %lld)",
                       op->name, op->inputs[0].name, n,
                       k < n_in ? op->inputs[k].name : op->outputs[k - n_in].name, cuplug_numel(&t));
    }
    if (n == 0) return CUPLUG_OK;
  }
  size_t all_bytes = 0;
  for (int k = 0; k < n_in + n_out; ++k) all_bytes += (size_t)tensor_bytes(k < n_in ? in[k] : out[k - n_in]);
  if ((op->flags & CUPLUG_ELEMENTWISE) && all_bytes > kDirectHostBytes) {
    StageJob j;
    memset(&j, 0, sizeof j);
    j.nin = n_in, j.nout = n_out;
    for (int i = 0; i < n_in; ++i) j.hin[i] = static_cast<const char*>(in[i].data), j.isz[i] = cuplug_dtype_size(in[i].dtype);
    for (int o = 0; o < n_out; ++o) j.hout[o] = static_cast<char*>(out[o].data), j.osz[o] = cuplug_dtype_size(out[o].dtype);
    j.op = op, j.in_t = in, j.out_t = out, j.attrs = attrs;
    return stage(h, j, n);
  }
  // Otherwise (an op that needs whole tensors on the device before it starts, or a small call) the operands
  // go to regions of the instance's device arrays, each kDeviceAlign-aligned.
  size_t offset[2 * kMaxArgs], total = 0;
  for (int k = 0; k < n_in + n_out; ++k) {
    offset[k] = total;
    total += ((size_t)tensor_bytes(k < n_in ? in[k] : out[k - n_in]) + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
  }
  int rc = ensure_host_arrays(h, std::max(total, kDeviceAlign));
  if (rc) return rc;
  cuplug_tensor din[kMaxArgs], dout[kMaxArgs];
  for (int k = 0; k < n_in + n_out; ++k) {
    cuplug_tensor& t = k < n_in ? din[k] : dout[k - n_in];
    t = k < n_in ? in[k] : out[k - n_in];
    t.data = h->host_arrays + offset[k];
    t.device_type = CUPLUG_DEVICE_CUDA;
    t.device_id = h->device;
  }
  for (int i = 0; i < n_in; ++i)
    if ((rc = upload_staged(h, din[i].data, in[i].data, (size_t)tensor_bytes(in[i])))) return rc;
  if ((rc = call_op(h, op, din, n_in, dout, n_out, attrs, h->stream, h->last_error, sizeof h->last_error))) return rc;
  for (int o = 0; o < n_out; ++o)  // stage() first waits for the op on the instance's stream
    if ((rc = download_staged(h, out[o].data, dout[o].data, (size_t)tensor_bytes(out[o])))) return rc;
  return CUPLUG_OK;
}

// The instance's device current on this thread: cudaSetDevice, unless its primary context already is current
// (a framework's thread usually has it so: cuCtxGetCurrent costs the host 8 ns against cudaSetDevice's 70,
// bench/cuda_call_costs.cu on the H200).
cudaError_t make_current(cuplug_backend* h) {
  CUcontext current = nullptr;
  if (h->context != nullptr && g_driver.ctx_get_current != nullptr &&
      g_driver.ctx_get_current(&current) == CUDA_SUCCESS && current == h->context)
    return cudaSuccess;
  return cudaSetDevice(h->device);
}

int call_locked(cuplug_backend* h, const char* opname, const cuplug_tensor* in, int n_in, cuplug_tensor* out,
                int n_out, const cuplug_attr* attrs, int n_attrs, uint64_t stream) {
  const cuplug_op* op = cuplug_find_op(cuplug_ops, kOpCount, opname);
  if (op == nullptr) {
    char names[512];
    cuplug_op_names(cuplug_ops, kOpCount, names, sizeof names);
    return h->fail(CUPLUG_E_UNKNOWN_OP, "unknown op '%s' (this backend has %s)", opname ? opname : "(null)", names);
  }
  cuplug_attr normalized[CUPLUG_MAX_ARGS];
  int rc = cuplug_check_call(op, in, n_in, out, n_out, attrs, n_attrs, normalized, h->last_error,
                             sizeof h->last_error);
  if (rc != CUPLUG_OK) return rc;

  // Where the operands live: all on this device, or all on the host.
  int n_dev = 0, n_host = 0, first_dev = -1, first_host = -1;
  for (int k = 0; k < n_in + n_out; ++k) {
    const cuplug_tensor& t = k < n_in ? in[k] : out[k - n_in];
    const char* what = k < n_in ? op->inputs[k].name : op->outputs[k - n_in].name;
    if (t.device_type == CUPLUG_DEVICE_CUDA) {
      if (n_dev++ == 0) first_dev = k;
    } else if (t.device_type == CUPLUG_DEVICE_CPU || t.device_type == CUPLUG_DEVICE_CUDA_HOST) {
      if (n_host++ == 0) first_host = k;
    } else {
      return h->fail(CUPLUG_E_WRONG_DEVICE,
                     "%s: %s has device_type %d; this CUDA backend takes CUDA tensors of cuda:%d (2) and host "
                     "tensors (CPU 1, CUDA host 3)",
                     op->name, what, (int)t.device_type, h->device);
    }
  }
  auto operand = [&](int k) { return k < n_in ? op->inputs[k].name : op->outputs[k - n_in].name; };
  auto tensor_at = [&](int k) -> const cuplug_tensor& { return k < n_in ? in[k] : out[k - n_in]; };
  if (n_dev > 0 && n_host > 0)
    return h->fail(CUPLUG_E_INVALID_ARGUMENT,
                   "%s: a mix of host and device operands: %s is a CUDA tensor (cuda:%d) but %s is a host tensor "
                   "(%s); pass all operands on the device or all on the host (a mixed call is not staged)",
                   op->name, operand(first_dev), (int)tensor_at(first_dev).device_id, operand(first_host),
                   device_type_name(tensor_at(first_host).device_type));

  cuplug_tensor fin[kMaxArgs], fout[kMaxArgs];
  fold(in, fin, n_in);
  fold(out, fout, n_out);
  CUPLUG_TRY(make_current(h), "cudaSetDevice");
  if (n_dev == 0 && n_in + n_out > 0) return call_host(h, op, fin, n_in, fout, n_out, normalized);

  for (int k = 0; k < n_in + n_out; ++k)
    if ((rc = check_device_tensor(h, op->name, operand(k), k < n_in ? fin[k] : fout[k - n_in]))) return rc;
  const long long n = n_in > 0 ? cuplug_numel(&fin[0]) : 0;
  if (n == 0 && (op->flags & CUPLUG_ELEMENTWISE)) return CUPLUG_OK;  // nothing to compute
  cudaStream_t s = stream != 0 ? reinterpret_cast<cudaStream_t>((uintptr_t)stream) : h->stream;
  return call_op(h, op, fin, n_in, fout, n_out, normalized, s, h->last_error, sizeof h->last_error);
}

// ---- resident tensors ----------------------------------------------------------

cuplug_resident* resident(cuplug_backend* h, long long id, const char* what) {
  cuplug_resident* r = cuplug_table_get(&h->tensors, id);
  if (r == nullptr)
    h->fail(CUPLUG_E_BAD_BUFFER,
            "%s: id %lld is not a live tensor of this instance (freed, stale, of another instance or made up)", what,
            id);
  return r;
}

// Copies a resident tensor's whole bytes from/to host memory (to_host: download), through the stagers.
int copy_resident(cuplug_backend* h, long long id, void* host, long long nbytes, bool to_host) {
  const char* what = to_host ? "download" : "upload";
  cuplug_resident* r = resident(h, id, what);
  if (r == nullptr) return CUPLUG_E_BAD_BUFFER;
  if (nbytes != r->nbytes) {
    char s[256];
    return h->fail(nbytes >= 0 && nbytes < r->nbytes ? CUPLUG_E_BUFFER_TOO_SMALL : CUPLUG_E_INVALID_ARGUMENT,
                   "%s: nbytes must be the tensor's whole size, %lld bytes (%s %s), got %lld", what, r->nbytes,
                   cuplug_dtype_name(r->dtype), cuplug_shape_text(r->ndim, r->shape, s, sizeof s), nbytes);
  }
  if (host == nullptr && nbytes > 0) return h->fail(CUPLUG_E_INVALID_ARGUMENT, "%s: NULL host pointer", what);
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  if (nbytes == 0) {  // nothing to copy; still ordered after the instance stream's work, as documented
    CUPLUG_TRY(cudaStreamSynchronize(h->stream), what);
    return CUPLUG_OK;
  }
  return to_host ? download_staged(h, host, r->ptr, (size_t)nbytes) : upload_staged(h, r->ptr, host, (size_t)nbytes);
}

void free_device(void* ptr, void*) { cudaFree(ptr); }

void release(cuplug_backend* h) {
  cudaSetDevice(h->device);
  if (h->stream) cudaStreamSynchronize(h->stream);
  if (h->scratch_event && h->scratch_recorded) cudaEventSynchronize(h->scratch_event);
  cuplug_table_clear(&h->tensors, free_device, nullptr);
  for (Stager& st : h->stagers) {
    if (st.stream) cudaStreamSynchronize(st.stream), cudaStreamDestroy(st.stream);
    for (int k = 0; k < 2; ++k) {
      if (st.pinned[k]) cudaFreeHost(st.pinned[k]);
      if (st.device[k]) cudaFree(st.device[k]);
      if (st.slot_free[k]) cudaEventDestroy(st.slot_free[k]);
    }
  }
  if (h->host_arrays) cudaFree(h->host_arrays);
  if (h->op_scratch) cudaFree(h->op_scratch);
  if (h->scratch_event) cudaEventDestroy(h->scratch_event);
  if (h->wait_event) cudaEventDestroy(h->wait_event);
  if (h->stream) cudaStreamDestroy(h->stream);
  cudaGetLastError();
}

void set_create_error(const char* step, cudaError_t err) {
  snprintf(g_create_error, CUPLUG_ERR_LEN, "%s: %s (%s)", step, cudaGetErrorName(err), cudaGetErrorString(err));
}

// The refusal of an instance inherited through fork() (no lock taken: the
// parent's threads that may have held it do not exist in the child).
int forked_error(cuplug_backend* h) {
  snprintf(h->last_error, sizeof h->last_error,
           "this CUDA backend instance was created before fork(); CUDA cannot be used in a forked child: create "
           "backends after the fork in a fresh process (multiprocessing start method 'spawn' or 'forkserver')");
  return CUPLUG_E_DEVICE;
}

}  // namespace cuplug_cuda

// Every entry point with an instance: NULL handle and forked-child checks, then the instance lock.
#define CUPLUG_ENTER(h)                                                   \
  if ((h) == nullptr) return CUPLUG_E_INVALID_ARGUMENT;                   \
  if ((h)->forked()) return cuplug_cuda::forked_error(h);                 \
  cuplug_cuda::Guard guard_(&(h)->lock)

extern "C" {

CUPLUG_API int cuplug_backend_abi_version(void) { return CUPLUG_BACKEND_ABI_VERSION; }

CUPLUG_API cuplug_backend* cuplug_backend_create(const char* device_pref) {
  using namespace cuplug_cuda;
  int device = 0;
  if (device_pref && device_pref[0] && strcmp(device_pref, "auto") != 0) {
    char* end = nullptr;
    long v = strtol(device_pref, &end, 10);
    if (*end != '\0' || v < 0 || v > 1023) {
      snprintf(g_create_error, CUPLUG_ERR_LEN, "device_pref must be 'auto' or a device index, got '%s'",
               device_pref);
      return nullptr;
    }
    device = (int)v;
  }
  Guard guard(&g_create_lock);
  const long long t_enter = now_us();
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    set_create_error("cudaGetDeviceCount", err);
    cudaGetLastError();
    return nullptr;
  }
  if (device >= count) {
    snprintf(g_create_error, CUPLUG_ERR_LEN, "device %d requested, %d visible", device, count);
    return nullptr;
  }
  cuplug_backend* h = static_cast<cuplug_backend*>(calloc(1, sizeof(cuplug_backend)));
  if (h == nullptr) {
    snprintf(g_create_error, CUPLUG_ERR_LEN, "out of host memory");
    return nullptr;
  }
  if (pthread_mutex_init(&h->lock, nullptr) != 0) {
    free(h);
    snprintf(g_create_error, CUPLUG_ERR_LEN, "pthread_mutex_init failed");
    return nullptr;
  }
  h->device = device;
  h->fork_generation = g_fork_generation;
  h->t_runtime_us = now_us() - t_enter;  // cudaGetDeviceCount: the static runtime's own initialization
  long long t = now_us();
  const char* step = "cudaSetDevice";
  err = cudaSetDevice(device);  // creates the primary context (CUDA 12+)
  if (err == cudaSuccess) step = "cudaFree(0) (context creation)", err = cudaFree(0);
  h->t_context_us = now_us() - t;
  t = now_us();
  if (err == cudaSuccess)
    step = "cudaDeviceGetAttribute(multiprocessors)",
    err = cudaDeviceGetAttribute(&h->sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess)
    step = "cudaDeviceGetAttribute(capability)",
    err = cudaDeviceGetAttribute(&h->cc_major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&h->cc_minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess)
    step = "cudaStreamCreate", err = cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    set_create_error(step, err);
    cudaGetLastError();
    release(h);
    pthread_mutex_destroy(&h->lock);
    free(h);
    return nullptr;
  }
  // The context the runtime made current for `device` (its primary context):
  // what device pointers passed to call() must belong to.
  if (!g_driver_resolved) resolve_driver(), g_driver_resolved = true;  // g_create_lock is held
  CUcontext ctx = nullptr;
  if (g_driver.ctx_get_current && g_driver.ctx_get_current(&ctx) == CUDA_SUCCESS) h->context = ctx;
  keep_primary_context(device);
  h->staging = staging_from_env();
  h->slot_buffers = slot_buffers();
  h->t_create_rest_us = now_us() - t;
  g_create_error[0] = '\0';
  return h;
}

CUPLUG_API int cuplug_backend_last_create_error(char* buf, int len) {
  return cuplug_write_text(cuplug_cuda::g_create_error, buf, len);
}

CUPLUG_API int cuplug_backend_last_error(cuplug_backend* h, char* buf, int len) {
  if (h == nullptr) return cuplug_write_text("NULL backend handle", buf, len);
  if (h->forked()) {
    cuplug_cuda::forked_error(h);
    return cuplug_write_text(h->last_error, buf, len);
  }
  cuplug_cuda::Guard guard(&h->lock);
  return cuplug_write_text(h->last_error, buf, len);
}

// The ping JSON, built in memory of the size it needs (never truncated), then
// copied into (buf, len); returns the full length.
CUPLUG_API int cuplug_backend_ping(cuplug_backend* h, char* buf, int len) {
  using namespace cuplug_cuda;
  CUPLUG_ENTER(h);
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  long long t_step = now_us();
  // Smoke launch: a missing kernel image for this GPU surfaces here.
  float* probe = nullptr;
  CUPLUG_TRY(cudaMalloc(&probe, 8 * sizeof(float)), "cudaMalloc(smoke)");
  smoke_kernel<<<1, 32, 0, h->stream>>>(probe, 8);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaStreamSynchronize(h->stream);
  cudaFree(probe);
  CUPLUG_TRY(err, "smoke launch");
  const long long smoke_us = now_us() - t_step;
  t_step = now_us();
  int driver = 0, runtime = 0;
  CUPLUG_TRY(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  CUPLUG_TRY(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  size_t free_b = 0, total_b = 0;
  CUPLUG_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  char name[257];
  device_name(h->device, name, sizeof name);
  const long long facts_us = now_us() - t_step;
  t_step = now_us();
  // The first ping (load()'s, part of every cold start) leaves NVML alone: temperature null.
  const int temp = h->pinged ? read_temperature_c(h->device) : -1;
  const long long nvml_us = now_us() - t_step;
  if (!h->pinged) {  // the first ping's steps are part of the start-up; later pings report the same numbers
    h->pinged = true;
    h->t_smoke_us = smoke_us, h->t_facts_us = facts_us, h->t_nvml_us = nvml_us;
  }
  char temp_s[16];
  if (temp >= 0)
    snprintf(temp_s, sizeof temp_s, "%d", temp);
  else
    snprintf(temp_s, sizeof temp_s, "null");

  const int ops_len = cuplug_ops_json(cuplug_ops, kOpCount, nullptr, 0);
  char* ops = static_cast<char*>(malloc((size_t)ops_len + 1));
  if (ops == nullptr) return h->fail(CUPLUG_E_OUT_OF_MEMORY, "ping: out of host memory for %d bytes of JSON", ops_len);
  cuplug_ops_json(cuplug_ops, kOpCount, ops, (size_t)ops_len + 1);
  cuplug_text t = {nullptr, 0, 0};
  char* info = nullptr;
  for (int pass = 0; pass < 2; ++pass) {  // pass 0 measures, pass 1 writes
    t.used = 0;
    cuplug_text_printf(&t, "{\"backend\":");
    cuplug_text_json_string(&t, CUPLUG_BACKEND_NAME);
    cuplug_text_printf(&t, ",\"variant\":");
    cuplug_text_json_string(&t, CUPLUG_VARIANT);
    cuplug_text_printf(&t, ",\"abi\":%d,\"driver_version\":%d,\"runtime_version\":%d,", CUPLUG_BACKEND_ABI_VERSION,
                       driver, runtime);
    cuplug_text_printf(&t, "\"device\":{\"type\":\"cuda\",\"index\":%d,\"name\":", h->device);
    cuplug_text_json_string(&t, name);
    cuplug_text_printf(&t,
                       ",\"capability\":\"%d.%d\",\"memory_free\":%llu,\"memory_total\":%llu,\"temperature_c\":%s,"
                       "\"multiprocessors\":%d},",
                       h->cc_major, h->cc_minor, (unsigned long long)free_b, (unsigned long long)total_b,
                       temp_s, h->sm_count);
    cuplug_text_printf(&t, "\"stream\":%llu,\"sass\":", (unsigned long long)(uintptr_t)h->stream);
    cuplug_text_json_string(&t, CUPLUG_SASS_LIST);
    cuplug_text_printf(&t, ",\"ptx\":");
    cuplug_text_json_string(&t, CUPLUG_PTX_LIST);
#ifdef CUPLUG_LTO_LIST
    // An LTO variant: its LTO-IR targets, and the SM its registered image was linked for (null: the built one).
    cuplug_text_printf(&t, ",\"lto\":");
    cuplug_text_json_string(&t, CUPLUG_LTO_LIST);
    if (cuplug_lto_linked_arch > 0)
      cuplug_text_printf(&t, ",\"lto_linked\":\"sm_%d\"", cuplug_lto_linked_arch);
    else
      cuplug_text_printf(&t, ",\"lto_linked\":null");
#endif
    cuplug_text_printf(&t,
                       ",\"staging\":{\"threads\":%d,\"chunk_kb\":%llu,\"copy\":\"%s\",\"schedule\":\"%s\"}",
                       h->staging.threads, (unsigned long long)(h->staging.chunk_bytes >> 10),
                       h->staging.stream_copy ? "stream" : "memcpy", h->staging.dynamic ? "dynamic" : "static");
    cuplug_text_printf(&t,
                       ",\"startup_us\":{\"runtime_init\":%lld,\"context\":%lld,\"create_rest\":%lld,"
                       "\"smoke_launch\":%lld,\"device_facts\":%lld,\"nvml\":%lld,\"nvml_init\":%lld}",
                       h->t_runtime_us, h->t_context_us, h->t_create_rest_us, h->t_smoke_us, h->t_facts_us,
                       h->t_nvml_us, g_nvml.init_us);
    cuplug_text_printf(&t, ",\"ops\":%s}", ops);
    if (pass == 0) {
      info = static_cast<char*>(malloc(t.used + 1));
      if (info == nullptr) break;
      t.buf = info;
      t.len = t.used + 1;
    }
  }
  free(ops);
  if (info == nullptr) return h->fail(CUPLUG_E_OUT_OF_MEMORY, "ping: out of host memory for the JSON");
  const int need = cuplug_write_text(info, buf, len);
  free(info);
  return need;
}

CUPLUG_API int cuplug_backend_call(cuplug_backend* h, const char* op, const cuplug_tensor* in, int n_in,
                                   cuplug_tensor* out, int n_out, const cuplug_attr* attrs, int n_attrs,
                                   uint64_t stream) {
  CUPLUG_ENTER(h);
  return cuplug_cuda::call_locked(h, op, in, n_in, out, n_out, attrs, n_attrs, stream);
}

CUPLUG_API int cuplug_backend_stream_wait(cuplug_backend* h, uint64_t waiter, uint64_t signaler) {
  CUPLUG_ENTER(h);
  cudaStream_t w = waiter != 0 ? reinterpret_cast<cudaStream_t>((uintptr_t)waiter) : h->stream;
  cudaStream_t s = signaler != 0 ? reinterpret_cast<cudaStream_t>((uintptr_t)signaler) : h->stream;
  if (w == s) return CUPLUG_OK;  // a stream is always ordered after its own earlier work
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  if (h->wait_event == nullptr)
    CUPLUG_TRY(cudaEventCreateWithFlags(&h->wait_event, cudaEventDisableTiming), "stream_wait: cudaEventCreate");
  // Reusing one event is safe: cudaStreamWaitEvent waits for the record made just before it.
  CUPLUG_TRY(cudaEventRecord(h->wait_event, s), "stream_wait: cudaEventRecord on the signaling stream");
  CUPLUG_TRY(cudaStreamWaitEvent(w, h->wait_event, 0), "stream_wait: cudaStreamWaitEvent on the waiting stream");
  return CUPLUG_OK;
}

CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, cuplug_dtype dtype, int ndim, const int64_t* shape) {
  CUPLUG_ENTER(h);
  const int itemsize = cuplug_dtype_size(dtype);
  char dt[64];
  if (itemsize == 0)
    return h->fail(CUPLUG_E_INVALID_ARGUMENT, "alloc: dtype %s is not one cuplug supports",
                   cuplug_dtype_text(dtype, dt, sizeof dt));
  long long numel = 0, nbytes = 0;
  int rc = cuplug_check_shape("alloc", ndim, shape, itemsize, &numel, &nbytes, h->last_error, sizeof h->last_error);
  if (rc != CUPLUG_OK) return rc;
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  void* p = nullptr;
  // A 0-byte tensor still gets a unique, non-NULL pointer (the table wants one, and so do some consumers).
  cudaError_t err = cudaMalloc(&p, nbytes > 0 ? (size_t)nbytes : 1);
  if (err != cudaSuccess) {
    cudaGetLastError();
    char s[256];
    return h->fail(cuplug_cuda::status_of(err), "alloc of %s %s (%lld bytes) on cuda:%d: %s (%s)",
                   cuplug_dtype_name(dtype), cuplug_shape_text(ndim, shape, s, sizeof s), nbytes, h->device,
                   err == cudaErrorMemoryAllocation ? "out of device memory" : cudaGetErrorName(err),
                   cudaGetErrorString(err));
  }
  long long id = cuplug_table_add(&h->tensors, p, dtype, ndim, shape, numel, nbytes);
  if (id < 0) {
    cudaFree(p);
    return h->fail((int)id, "alloc: resident tensor table full");
  }
  return id;
}

CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id, const void* host, long long nbytes) {
  CUPLUG_ENTER(h);
  return cuplug_cuda::copy_resident(h, id, const_cast<void*>(host), nbytes, false);
}

CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id, void* host, long long nbytes) {
  CUPLUG_ENTER(h);
  return cuplug_cuda::copy_resident(h, id, host, nbytes, true);
}

CUPLUG_API int cuplug_backend_tensor(cuplug_backend* h, long long id, cuplug_tensor* out) {
  CUPLUG_ENTER(h);
  cuplug_resident* r = cuplug_cuda::resident(h, id, "tensor");
  if (r == nullptr) return CUPLUG_E_BAD_BUFFER;
  if (out == nullptr) return h->fail(CUPLUG_E_INVALID_ARGUMENT, "tensor: NULL descriptor pointer");
  cuplug_resident_descriptor(r, CUPLUG_DEVICE_CUDA, h->device, out);
  return CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_free(cuplug_backend* h, long long id) {
  CUPLUG_ENTER(h);
  cuplug_resident* r = cuplug_cuda::resident(h, id, "free");
  if (r == nullptr) return CUPLUG_E_BAD_BUFFER;
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  CUPLUG_TRY(cudaStreamSynchronize(h->stream), "free: sync before free");  // queued work may still use it
  CUPLUG_TRY(cudaFree(cuplug_table_remove(&h->tensors, r)), "free: cudaFree");
  return CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_sync(cuplug_backend* h) {
  CUPLUG_ENTER(h);
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  CUPLUG_TRY(cudaStreamSynchronize(h->stream), "cudaStreamSynchronize");
  return CUPLUG_OK;
}

CUPLUG_API void cuplug_backend_destroy(cuplug_backend* h) {
  if (h == nullptr) return;
  if (h->forked()) return;  // the child must not touch the parent's CUDA objects (nor a lock held at fork): leaked
  {
    cuplug_cuda::Guard guard(&h->lock);  // a call still running on another thread finishes first
    cuplug_cuda::release(h);
  }
  pthread_mutex_destroy(&h->lock);
  free(h);
}

}  // extern "C"

#endif  // CUPLUG_CUDA_BACKEND_CUH
