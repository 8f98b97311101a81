// The whole C ABI of a CUDA backend around a table `cuplug_ops` (see cuplug_ops.h).
// Include it once, at the end of the backend's .cu file, after the table.
//
// What it does for every backend: device selection and context creation in
// create() under a process-wide lock; one non-blocking stream per instance; a
// smoke launch in ping() (a missing kernel image shows there, not in the user's
// work); backend-owned pinned staging for host arrays (never a caller pointer
// handed to the DMA engine) filled by several CPU threads; device-resident
// buffers; and a private copy of the last error per instance (never
// cudaGetLastError's sticky state).
#ifndef CUPLUG_CUDA_BACKEND_CUH
#define CUPLUG_CUDA_BACKEND_CUH

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "cuplug_common.h"
#include "cuplug_ops.h"

#ifndef CUPLUG_VARIANT
#define CUPLUG_VARIANT "unknown"
#endif
#ifndef CUPLUG_SASS_LIST
#define CUPLUG_SASS_LIST ""
#endif
#ifndef CUPLUG_PTX_LIST
#define CUPLUG_PTX_LIST ""
#endif

// A named namespace, not an anonymous one: cudafe++ names anonymous namespaces
// with a random per-compile id, which made two clean builds differ.
namespace cuplug_cuda {

constexpr int kOpCount = CUPLUG_OP_COUNT(cuplug_ops);
// Host arrays move in chunks through pinned staging. One CPU thread's memcpy
// into pinned memory runs at ~10 GB/s, well below PCIe 5; so up to kMaxStagers
// threads each pipeline their own range (own stream, own two chunk slots), and
// elementwise ops run per chunk, so H2D, kernel and D2H overlap.
constexpr size_t kChunkBytes = size_t(2) << 20;
constexpr int kMaxStagers = 8;
constexpr size_t kMinBytesPerStager = size_t(16) << 20;  // below this, threads cost more than they give

// No libstdc++ types here (pthread, not std::mutex): with the old-glibc sysroot the
// library then needs only GLIBCXX symbols that manylinux2014 allows.
pthread_mutex_t g_create_lock = PTHREAD_MUTEX_INITIALIZER;  // device selection + context creation

struct Guard {
  pthread_mutex_t* m;
  explicit Guard(pthread_mutex_t* mutex) : m(mutex) { pthread_mutex_lock(m); }
  ~Guard() { pthread_mutex_unlock(m); }
};
long long g_next_serial = 1;
thread_local char g_create_error[CUPLUG_ERR_LEN];

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

// Temperature through NVML, opened at run time only if the driver ships it:
// the backend links nothing but the static CUDA runtime.
int read_temperature_c(int device) {
  static void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml == nullptr) return -1;
  using init_fn = int (*)();
  using by_bus_fn = int (*)(const char*, void**);
  using temp_fn = int (*)(void*, int, unsigned*);
  static auto init = reinterpret_cast<init_fn>(dlsym(nvml, "nvmlInit_v2"));
  static auto by_bus = reinterpret_cast<by_bus_fn>(dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2"));
  static auto temp = reinterpret_cast<temp_fn>(dlsym(nvml, "nvmlDeviceGetTemperature"));
  static int init_rc = init ? init() : -1;
  char bus[32];
  void* handle = nullptr;
  unsigned t = 0;
  if (init_rc != 0 || !by_bus || !temp || cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess)
    return -1;
  if (by_bus(bus, &handle) != 0 || temp(handle, 0 /* NVML_TEMPERATURE_GPU */, &t) != 0) return -1;
  return (int)t;
}

// One host-path pipeline: a stream and two slots, each with room for two
// input chunks and one output chunk.
struct Stager {
  cudaStream_t stream;
  char* pinned[2];  // slot k: in0 | in1 | out, kChunkBytes each
  cudaEvent_t slot_free[2];
};

int stagers_from_env() {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int n = (int)std::max(1L, std::min((long)kMaxStagers, cpus / 2));
  if (const char* v = getenv("CUPLUG_STAGING_THREADS")) {
    long want = strtol(v, nullptr, 10);
    if (want >= 1) n = (int)std::min((long)kMaxStagers, want);
  }
  return n;
}

}  // namespace cuplug_cuda

// Allocated with calloc: every member starts zero/NULL.
struct cuplug_backend {
  pthread_mutex_t lock;  // serializes calls on one instance
  int device;
  int sm_count;
  cudaDeviceProp props;
  cudaStream_t stream;
  cuplug_buffer_table buffers;
  cuplug_cuda::Stager stagers[cuplug_cuda::kMaxStagers];  // host-path pipelines, made on first use
  int max_stagers;
  char* host_arrays;  // device arrays for the host path: x | y | out
  size_t host_arrays_bytes;
  void* op_scratch;  // cuplug_cuda_scratch(), for ops that need temporary device memory
  size_t op_scratch_bytes;
  char last_error[CUPLUG_ERR_LEN];

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
};

// Temporary device memory for an op that is not elementwise (e.g. per-block
// partials of a reduction), kept by the instance and grown on demand. NULL when
// the device is out of memory. Not for elementwise ops (they run from several
// staging threads at once).
void* cuplug_cuda_scratch(const cuplug_call* call, size_t bytes) {
  cuplug_backend* h = static_cast<cuplug_backend*>(call->backend);
  if (h->op_scratch_bytes >= bytes) return h->op_scratch;
  cudaStreamSynchronize(h->stream);  // earlier work may still use the old block
  if (h->op_scratch) cudaFree(h->op_scratch);
  h->op_scratch = nullptr;
  h->op_scratch_bytes = 0;
  if (cudaMalloc(&h->op_scratch, bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  h->op_scratch_bytes = bytes;
  return h->op_scratch;
}

#define CUPLUG_TRY(expr, step)                 \
  do {                                         \
    int rc_ = h->check((expr), (step));        \
    if (rc_ != CUPLUG_OK) return rc_;          \
  } while (0)

namespace cuplug_cuda {

// Runs one op on `stream`; a failure carries the op's name and the CUDA error.
int call_op(const cuplug_op* op, cuplug_backend* h, cudaStream_t stream, const float* x, const float* y, float alpha,
            float beta, float* out, long long n, char* error, size_t error_len) {
  cuplug_call call = {x, y, alpha, beta, out, n, stream, h->sm_count, h};
  int rc = op->fn(&call);
  cudaError_t launch = cudaGetLastError();
  if (rc == CUPLUG_OK && launch == cudaSuccess) return CUPLUG_OK;
  if (launch != cudaSuccess) rc = status_of(launch);
  snprintf(error, error_len, "op %s: %s (%s)", op->name, launch != cudaSuccess ? cudaGetErrorName(launch) : "failed",
           launch != cudaSuccess ? cudaGetErrorString(launch) : "the op returned an error");
  return rc;
}

// The same on the instance's own stream, the error recorded as the instance's.
int run_op(cuplug_backend* h, const cuplug_op* op, const float* x, const float* y, float alpha, float beta, float* out,
           long long n) {
  return call_op(op, h, h->stream, x, y, alpha, beta, out, n, h->last_error, sizeof h->last_error);
}

int ensure_host_arrays(cuplug_backend* h, size_t bytes) {
  if (h->host_arrays_bytes >= bytes) return CUPLUG_OK;
  if (h->host_arrays) cudaFree(h->host_arrays);
  h->host_arrays = nullptr;
  h->host_arrays_bytes = 0;
  CUPLUG_TRY(cudaMalloc(&h->host_arrays, bytes), "cudaMalloc(host-path arrays)");
  h->host_arrays_bytes = bytes;
  return CUPLUG_OK;
}

int ensure_stager(cuplug_backend* h, int i) {
  Stager* st = &h->stagers[i];
  if (st->stream) return CUPLUG_OK;
  for (int k = 0; k < 2; ++k) {  // after a failed attempt, keep what was made (release() frees it)
    if (!st->pinned[k]) CUPLUG_TRY(cudaMallocHost(&st->pinned[k], 3 * kChunkBytes), "cudaMallocHost(staging)");
    if (!st->slot_free[k])
      CUPLUG_TRY(cudaEventCreateWithFlags(&st->slot_free[k], cudaEventDisableTiming), "cudaEventCreate(staging)");
  }
  CUPLUG_TRY(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate(staging)");
  return CUPLUG_OK;
}

// What one stager does with its byte range [begin, end) of the arrays:
// upload `in[i]` to `din[i]`, run the elementwise `op` (or none) from din into
// `dres`, and download `dres` into `out` (or nothing).
struct StageJob {
  cuplug_backend* h;
  Stager* st;
  int nin;
  const char* in[2];
  char* din[2];
  const cuplug_op* op;
  float alpha, beta;
  char* dres;
  char* out;
  size_t begin, end;
  int rc;
  char error[CUPLUG_ERR_LEN];
};

int stage_fail(StageJob* j, cudaError_t err, const char* step) {
  snprintf(j->error, sizeof j->error, "%s: %s (%s)", step, cudaGetErrorName(err), cudaGetErrorString(err));
  return j->rc = status_of(err);
}

#define CUPLUG_STAGE_TRY(expr, step)                            \
  do {                                                          \
    cudaError_t e_ = (expr);                                    \
    if (e_ != cudaSuccess) return stage_fail(j, e_, (step));    \
  } while (0)

int stage_range(StageJob* j) {
  Stager* st = j->st;
  CUPLUG_STAGE_TRY(cudaSetDevice(j->h->device), "cudaSetDevice(staging)");
  size_t pending_off[2] = {0, 0}, pending_len[2] = {0, 0};  // output chunk waiting in each slot
  auto drain = [&](int slot) -> cudaError_t {
    cudaError_t e = cudaEventSynchronize(st->slot_free[slot]);
    if (e == cudaSuccess && pending_len[slot])
      memcpy(j->out + pending_off[slot], st->pinned[slot] + 2 * kChunkBytes, pending_len[slot]);
    pending_len[slot] = 0;
    return e;
  };
  for (size_t off = j->begin, k = 0; off < j->end; off += kChunkBytes, ++k) {
    size_t len = std::min(kChunkBytes, j->end - off);
    int slot = (int)(k & 1);
    CUPLUG_STAGE_TRY(drain(slot), "staging wait");
    for (int i = 0; i < j->nin; ++i) {
      char* pin = st->pinned[slot] + i * kChunkBytes;
      memcpy(pin, j->in[i] + off, len);
      CUPLUG_STAGE_TRY(cudaMemcpyAsync(j->din[i] + off, pin, len, cudaMemcpyHostToDevice, st->stream),
                       "cudaMemcpyAsync(H2D)");
    }
    if (j->op != nullptr) {
      const float* x = reinterpret_cast<const float*>(j->din[0] + off);
      const float* y = j->nin > 1 ? reinterpret_cast<const float*>(j->din[1] + off) : nullptr;
      int rc = call_op(j->op, j->h, st->stream, x, y, j->alpha, j->beta, reinterpret_cast<float*>(j->dres + off),
                       (long long)(len / sizeof(float)), j->error, sizeof j->error);
      if (rc != CUPLUG_OK) return j->rc = rc;
    }
    if (j->out) {
      CUPLUG_STAGE_TRY(cudaMemcpyAsync(st->pinned[slot] + 2 * kChunkBytes, j->dres + off, len,
                                       cudaMemcpyDeviceToHost, st->stream), "cudaMemcpyAsync(D2H)");
      pending_off[slot] = off, pending_len[slot] = len;
    }
    CUPLUG_STAGE_TRY(cudaEventRecord(st->slot_free[slot], st->stream), "cudaEventRecord(staging)");
  }
  for (int slot = 0; slot < 2; ++slot) CUPLUG_STAGE_TRY(drain(slot), "staging wait");
  CUPLUG_STAGE_TRY(cudaStreamSynchronize(st->stream), "staging sync");
  return j->rc = CUPLUG_OK;
}

void* stage_thread(void* job) {
  stage_range(static_cast<StageJob*>(job));
  return nullptr;
}

// Splits `bytes` over the stagers (whole chunks each), runs them and waits.
// Every range is done (or failed) when this returns; the first failure is
// recorded as the instance's error.
int stage(cuplug_backend* h, StageJob tmpl, size_t bytes) {
  // Work already queued on the instance's stream may read or write these arrays.
  CUPLUG_TRY(cudaStreamSynchronize(h->stream), "sync before staging");
  size_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  int n = (int)std::max<size_t>(1, std::min<size_t>({(size_t)h->max_stagers, bytes / kMinBytesPerStager, chunks}));
  for (int i = 0; i < n; ++i) {
    int rc = ensure_stager(h, i);
    if (rc) return rc;
  }
  StageJob jobs[kMaxStagers];
  pthread_t threads[kMaxStagers];
  bool started[kMaxStagers] = {};
  tmpl.h = h;
  for (int i = 0; i < n; ++i) {
    jobs[i] = tmpl;
    jobs[i].st = &h->stagers[i];
    jobs[i].begin = std::min(bytes, (chunks * i / n) * kChunkBytes);
    jobs[i].end = std::min(bytes, (chunks * (i + 1) / n) * kChunkBytes);
    jobs[i].rc = CUPLUG_OK;
    jobs[i].error[0] = '\0';
    // Range 0 runs on the calling thread; if a thread cannot start, its range does too.
    started[i] = i > 0 && pthread_create(&threads[i], nullptr, stage_thread, &jobs[i]) == 0;
  }
  for (int i = 0; i < n; ++i)
    if (!started[i]) stage_range(&jobs[i]);
  for (int i = 0; i < n; ++i)
    if (started[i]) pthread_join(threads[i], nullptr);
  for (int i = 0; i < n; ++i)
    if (jobs[i].rc != CUPLUG_OK) return h->fail(jobs[i].rc, "%s", jobs[i].error);
  return CUPLUG_OK;
}

int upload_staged(cuplug_backend* h, void* dev, const void* host, size_t bytes) {
  StageJob j = {};
  j.nin = 1, j.in[0] = static_cast<const char*>(host), j.din[0] = static_cast<char*>(dev);
  return stage(h, j, bytes);
}

int download_staged(cuplug_backend* h, void* host, const void* dev, size_t bytes) {
  StageJob j = {};
  j.dres = const_cast<char*>(static_cast<const char*>(dev)), j.out = static_cast<char*>(host);
  return stage(h, j, bytes);
}

const cuplug_op* check_op(cuplug_backend* h, const char* op, long long n, int* rc) {
  const cuplug_op* found = cuplug_find_op(cuplug_ops, kOpCount, op);
  if (found == nullptr) {
    char names[256];
    cuplug_op_names(cuplug_ops, kOpCount, names, sizeof names);
    *rc = h->fail(CUPLUG_E_UNKNOWN_OP, "unknown op '%s' (expected %s)", op ? op : "(null)", names);
  } else if (n <= 0 || n > CUPLUG_MAX_ELEMENTS) {
    *rc = h->fail(CUPLUG_E_INVALID_ARGUMENT, "n must be in 1..%lld, got %lld", CUPLUG_MAX_ELEMENTS, n);
    found = nullptr;
  }
  return found;
}

cuplug_buffer* buffer_for(cuplug_backend* h, long long id, long long n, const char* what, int* rc) {
  cuplug_buffer* b = cuplug_table_get(&h->buffers, id);
  if (b == nullptr) {
    *rc = h->fail(CUPLUG_E_BAD_BUFFER, "%s: buffer id %lld is not a live buffer of this instance", what, id);
  } else if (n <= 0 || n > b->n) {
    *rc = h->fail(n <= 0 ? CUPLUG_E_INVALID_ARGUMENT : CUPLUG_E_BUFFER_TOO_SMALL,
                  "%s: n=%lld does not fit buffer %lld of %lld elements", what, n, id, b->n);
    b = nullptr;
  }
  return b;
}

// Copies n floats between a host array and buffer id (to_host: download), through the stagers.
int copy_buffer(cuplug_backend* h, long long id, float* host, long long n, bool to_host) {
  const char* what = to_host ? "download" : "upload";
  int rc = CUPLUG_OK;
  cuplug_buffer* b = buffer_for(h, id, n, what, &rc);
  if (!b) return rc;
  if (!host) return h->fail(CUPLUG_E_INVALID_ARGUMENT, "%s: NULL host pointer", what);
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  size_t bytes = (size_t)n * sizeof(float);
  return to_host ? download_staged(h, host, b->ptr, bytes) : upload_staged(h, b->ptr, host, bytes);
}

void release(cuplug_backend* h) {
  cudaSetDevice(h->device);
  if (h->stream) cudaStreamSynchronize(h->stream);
  for (long long i = 0; i < h->buffers.count; ++i)
    if (h->buffers.slots[i].ptr) cudaFree(h->buffers.slots[i].ptr);
  free(h->buffers.slots);
  for (Stager& st : h->stagers) {
    if (st.stream) cudaStreamSynchronize(st.stream), cudaStreamDestroy(st.stream);
    for (int k = 0; k < 2; ++k) {
      if (st.pinned[k]) cudaFreeHost(st.pinned[k]);
      if (st.slot_free[k]) cudaEventDestroy(st.slot_free[k]);
    }
  }
  if (h->host_arrays) cudaFree(h->host_arrays);
  if (h->op_scratch) cudaFree(h->op_scratch);
  if (h->stream) cudaStreamDestroy(h->stream);
}

void set_create_error(const char* step, cudaError_t err) {
  snprintf(g_create_error, CUPLUG_ERR_LEN, "%s: %s (%s)", step, cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace cuplug_cuda

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
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    set_create_error("cudaGetDeviceCount", err);
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
  pthread_mutex_init(&h->lock, nullptr);
  h->device = device;
  h->buffers.serial = g_next_serial++;
  const char* step = "cudaSetDevice";
  err = cudaSetDevice(device);
  if (err == cudaSuccess) step = "cudaFree(0) (context creation)", err = cudaFree(0);
  if (err == cudaSuccess) step = "cudaGetDeviceProperties", err = cudaGetDeviceProperties(&h->props, device);
  if (err == cudaSuccess) step = "cudaStreamCreate", err = cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    set_create_error(step, err);
    cudaGetLastError();
    release(h);
    pthread_mutex_destroy(&h->lock);
    free(h);
    return nullptr;
  }
  h->sm_count = h->props.multiProcessorCount;
  h->max_stagers = stagers_from_env();
  g_create_error[0] = '\0';
  return h;
}

CUPLUG_API int cuplug_backend_last_create_error(char* buf, int len) {
  return cuplug_write_text(cuplug_cuda::g_create_error, buf, len);
}

CUPLUG_API int cuplug_backend_last_error(cuplug_backend* h, char* buf, int len) {
  if (h == nullptr) return cuplug_write_text("NULL backend handle", buf, len);
  cuplug_cuda::Guard guard(&h->lock);
  return cuplug_write_text(h->last_error, buf, len);
}

CUPLUG_API int cuplug_backend_ping(cuplug_backend* h, char* buf, int len) {
  using namespace cuplug_cuda;
  if (h == nullptr) return CUPLUG_E_INVALID_ARGUMENT;
  Guard guard(&h->lock);
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  // Smoke launch: a missing kernel image for this GPU surfaces here.
  float* probe = nullptr;
  CUPLUG_TRY(cudaMalloc(&probe, 8 * sizeof(float)), "cudaMalloc(smoke)");
  smoke_kernel<<<1, 32, 0, h->stream>>>(probe, 8);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaStreamSynchronize(h->stream);
  cudaFree(probe);
  CUPLUG_TRY(err, "smoke launch");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  size_t free_b = 0, total_b = 0;
  CUPLUG_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  int temp = read_temperature_c(h->device);
  char temp_s[16];
  if (temp >= 0) snprintf(temp_s, sizeof temp_s, "%d", temp); else snprintf(temp_s, sizeof temp_s, "null");
  char name[256];
  size_t k = 0;
  for (const char* c = h->props.name; *c && k + 1 < sizeof name; ++c)
    if (*c != '"' && *c != '\\') name[k++] = *c;
  name[k] = '\0';
  char ops[1024], info[3072];
  cuplug_ops_json(cuplug_ops, kOpCount, ops, sizeof ops);
  snprintf(info, sizeof info,
           "{\"backend\":\"%s\",\"variant\":\"%s\",\"abi\":%d,\"driver_version\":%d,"
           "\"runtime_version\":%d,\"device\":{\"index\":%d,\"name\":\"%s\",\"capability\":\"%d.%d\","
           "\"memory_free\":%zu,\"memory_total\":%zu,\"temperature_c\":%s,\"multiprocessors\":%d},"
           "\"sass\":\"%s\",\"ptx\":\"%s\",\"ops\":%s}",
           CUPLUG_BACKEND_NAME, CUPLUG_VARIANT, CUPLUG_BACKEND_ABI_VERSION, driver, runtime, h->device, name,
           h->props.major, h->props.minor, free_b, total_b, temp_s, h->sm_count, CUPLUG_SASS_LIST, CUPLUG_PTX_LIST,
           ops);
  return cuplug_write_text(info, buf, len);
}

CUPLUG_API int cuplug_backend_run(cuplug_backend* h, const char* op, const float* x, const float* y, float alpha,
                                  float beta, float* out, long long n) {
  using namespace cuplug_cuda;
  if (h == nullptr) return CUPLUG_E_INVALID_ARGUMENT;
  Guard guard(&h->lock);
  int rc = CUPLUG_OK;
  const cuplug_op* found = check_op(h, op, n, &rc);
  if (found == nullptr) return rc;
  bool two = found->inputs > 1;
  if (!x || !out || (two && !y)) return h->fail(CUPLUG_E_INVALID_ARGUMENT, "%s: NULL input or output pointer", op);
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  // Device layout: x | y | out, each rounded up to 256 bytes to keep float4 alignment.
  size_t bytes = (size_t)n * sizeof(float), slot = (bytes + 255) & ~size_t(255);
  if ((rc = ensure_host_arrays(h, 3 * slot))) return rc;
  char* dx = h->host_arrays;
  char* dy = h->host_arrays + slot;
  char* dout = h->host_arrays + 2 * slot;
  if (found->elementwise) {  // chunk by chunk, so uploads, kernels and downloads overlap
    StageJob j = {};
    j.nin = two ? 2 : 1;
    j.in[0] = reinterpret_cast<const char*>(x), j.in[1] = reinterpret_cast<const char*>(y);
    j.din[0] = dx, j.din[1] = dy;
    j.op = found, j.alpha = alpha, j.beta = beta;
    j.dres = dout, j.out = reinterpret_cast<char*>(out);
    return stage(h, j, bytes);
  }
  // Otherwise the op needs whole arrays on the device before it starts.
  if ((rc = upload_staged(h, dx, x, bytes))) return rc;
  if (two && (rc = upload_staged(h, dy, y, bytes))) return rc;
  if ((rc = run_op(h, found, reinterpret_cast<float*>(dx), two ? reinterpret_cast<float*>(dy) : nullptr, alpha, beta,
                   reinterpret_cast<float*>(dout), n)))
    return rc;
  return download_staged(h, out, dout, found->out == CUPLUG_OUT_ONE ? sizeof(float) : bytes);
}

CUPLUG_API long long cuplug_backend_alloc(cuplug_backend* h, long long n) {
  if (h == nullptr) return CUPLUG_E_INVALID_ARGUMENT;
  cuplug_cuda::Guard guard(&h->lock);
  if (n <= 0 || n > CUPLUG_MAX_ELEMENTS)
    return h->fail(CUPLUG_E_INVALID_ARGUMENT, "alloc: n must be in 1..%lld, got %lld", CUPLUG_MAX_ELEMENTS, n);
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, (size_t)n * sizeof(float));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return h->fail(cuplug_cuda::status_of(err), "alloc of %lld floats (%lld bytes): %s (%s)", n,
                   n * (long long)sizeof(float),
                   err == cudaErrorMemoryAllocation ? "out of memory" : cudaGetErrorName(err), cudaGetErrorString(err));
  }
  long long id = cuplug_table_add(&h->buffers, p, n);
  if (id < 0) {
    cudaFree(p);
    return h->fail((int)id, "alloc: buffer table full");
  }
  return id;
}

CUPLUG_API int cuplug_backend_upload(cuplug_backend* h, long long id, const float* host, long long n) {
  if (h == nullptr) return CUPLUG_E_INVALID_ARGUMENT;
  cuplug_cuda::Guard guard(&h->lock);
  return cuplug_cuda::copy_buffer(h, id, const_cast<float*>(host), n, false);
}

CUPLUG_API int cuplug_backend_download(cuplug_backend* h, long long id, float* host, long long n) {
  if (h == nullptr) return CUPLUG_E_INVALID_ARGUMENT;
  cuplug_cuda::Guard guard(&h->lock);
  return cuplug_cuda::copy_buffer(h, id, host, n, true);
}

CUPLUG_API int cuplug_backend_run_resident(cuplug_backend* h, const char* op, long long in_id, long long in2_id,
                                           long long out_id, float alpha, float beta, long long n) {
  using namespace cuplug_cuda;
  if (h == nullptr) return CUPLUG_E_INVALID_ARGUMENT;
  Guard guard(&h->lock);
  int rc = CUPLUG_OK;
  const cuplug_op* found = check_op(h, op, n, &rc);
  if (found == nullptr) return rc;
  cuplug_buffer *x = nullptr, *y = nullptr, *out = nullptr;
  x = buffer_for(h, in_id, n, "input", &rc);
  if (!rc && found->inputs > 1) y = buffer_for(h, in2_id, n, "input2", &rc);
  if (!rc) out = buffer_for(h, out_id, found->out == CUPLUG_OUT_ONE ? 1 : n, "output", &rc);
  if (rc) return rc;
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  return run_op(h, found, (const float*)x->ptr, y ? (const float*)y->ptr : nullptr, alpha, beta, (float*)out->ptr, n);
}

CUPLUG_API int cuplug_backend_sync(cuplug_backend* h) {
  if (h == nullptr) return CUPLUG_E_INVALID_ARGUMENT;
  cuplug_cuda::Guard guard(&h->lock);
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  CUPLUG_TRY(cudaStreamSynchronize(h->stream), "cudaStreamSynchronize");
  return CUPLUG_OK;
}

CUPLUG_API int cuplug_backend_free(cuplug_backend* h, long long id) {
  if (h == nullptr) return CUPLUG_E_INVALID_ARGUMENT;
  cuplug_cuda::Guard guard(&h->lock);
  cuplug_buffer* b = cuplug_table_get(&h->buffers, id);
  if (b == nullptr)
    return h->fail(CUPLUG_E_BAD_BUFFER, "free: buffer id %lld is not a live buffer of this instance", id);
  CUPLUG_TRY(cudaSetDevice(h->device), "cudaSetDevice");
  CUPLUG_TRY(cudaStreamSynchronize(h->stream), "sync before free");  // work may still read it
  cudaFree(b->ptr);
  b->ptr = nullptr;
  return CUPLUG_OK;
}

CUPLUG_API void cuplug_backend_destroy(cuplug_backend* h) {
  if (h == nullptr) return;
  {
    cuplug_cuda::Guard guard(&h->lock);
    cuplug_cuda::release(h);
  }
  pthread_mutex_destroy(&h->lock);
  free(h);
}

}  // extern "C"

#endif  // CUPLUG_CUDA_BACKEND_CUH
