// What the host pays per CUDA runtime/driver call that a cuplug backend call makes, on 1-element work:
// the launch itself, cudaSetDevice, and the pointer queries of the device-tensor check
// (backends/common/cuplug_cuda_backend.cuh, check_device_tensor), and, given a backend library, its whole
// cuplug_backend_call (the C ABI with no Python above it). Median of 7 loops of N calls, ns.
//
// A loop of N launches can wait for the GPU (a tiny kernel takes the GPU longer than the host its launch once
// the launch queue is full): the "host only" rows time bursts of 256 calls with a synchronize outside the timed
// window, so they are what the host pays, not the GPU's throughput.
//
//   nvcc -O2 -o /tmp/costs bench/cuda_call_costs.cu -lcuda -ldl && /tmp/costs [N [path/to/libcuplug_vector.so]]
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include "../backends/include/cuplug/backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void add1(const float* x, const float* y, float* o, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) o[i] = x[i] + y[i];
}

template <class F>
static double median_ns(int n, F f) {
  std::vector<double> loops;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    auto t1 = std::chrono::steady_clock::now();
    cudaDeviceSynchronize();
    loops.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
  }
  std::sort(loops.begin(), loops.end());
  return loops[3];
}

// Bursts of 256 calls, each burst timed alone, the GPU drained between bursts: the host's own cost per call.
template <class F>
static double host_only_ns(int n, F f) {
  const int burst = 256;
  std::vector<double> loops;
  for (int r = 0; r < 7; ++r) {
    double total = 0;
    int done = 0;
    for (; done < n; done += burst) {
      cudaDeviceSynchronize();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < burst; ++i) f();
      total += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    }
    loops.push_back(total / done);
  }
  std::sort(loops.begin(), loops.end());
  return loops[3];
}

typedef cuplug_backend* (*create_fn)(const char*);
typedef int (*call_fn)(cuplug_backend*, const char*, const cuplug_tensor*, int, cuplug_tensor*, int,
                       const cuplug_attr*, int, uint64_t);

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  float *x, *y, *o;
  cudaMalloc(&x, 4096), cudaMalloc(&y, 4096), cudaMalloc(&o, 4096);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  CUcontext ctx;
  cuCtxGetCurrent(&ctx);
  printf("{\"calls_per_loop\": %d", n);
  printf(", \"launch <<<1,256>>>\": %.1f", median_ns(n, [&] { add1<<<1, 256, 0, s>>>(x, y, o, 1); }));
  printf(", \"cudaSetDevice\": %.1f", median_ns(n, [&] { cudaSetDevice(0); }));
  printf(", \"cudaGetLastError\": %.1f", median_ns(n, [&] { cudaGetLastError(); }));
  printf(", \"cudaPointerGetAttributes\": %.1f", median_ns(n, [&] {
           cudaPointerAttributes a;
           cudaPointerGetAttributes(&a, x + 1);
         }));
  CUpointer_attribute three[3] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  printf(", \"cuPointerGetAttributes x3\": %.1f", median_ns(n, [&] {
           CUcontext c;
           CUdeviceptr start;
           size_t size;
           void* v[3] = {&c, &start, &size};
           cuPointerGetAttributes(3, three, v, (CUdeviceptr)(x + 1));
         }));
  CUpointer_attribute six[6] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                CU_POINTER_ATTRIBUTE_IS_MANAGED,     CU_POINTER_ATTRIBUTE_CONTEXT,
                                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  printf(", \"cuPointerGetAttributes x6\": %.1f", median_ns(n, [&] {
           unsigned type;
           int ordinal;
           unsigned managed;
           CUcontext c;
           CUdeviceptr start;
           size_t size;
           void* v[6] = {&type, &ordinal, &managed, &c, &start, &size};
           cuPointerGetAttributes(6, six, v, (CUdeviceptr)(x + 1));
         }));
  printf(", \"cuCtxGetCurrent\": %.1f", median_ns(n, [&] {
           CUcontext c;
           cuCtxGetCurrent(&c);
         }));
  printf(", \"launch <<<1,256>>>, host only\": %.1f", host_only_ns(n, [&] { add1<<<1, 256, 0, s>>>(x, y, o, 1); }));
  // The driver's launch of the same kernel by handle (issue 30: is the runtime's stub-to-function lookup a part of
  // the launch's cost?): cudaGetFuncBySymbol gives the CUfunction the runtime itself launches.
  cudaFunction_t fn = nullptr;
  if (cudaGetFuncBySymbol(&fn, (const void*)add1) == cudaSuccess) {
    long long one = 1;
    void* args[] = {&x, &y, &o, &one};
    printf(", \"cuLaunchKernel by handle, host only\": %.1f", host_only_ns(n, [&] {
             cuLaunchKernel((CUfunction)fn, 1, 1, 1, 256, 1, 1, 0, (CUstream)s, args, nullptr);
           }));
    printf(", \"cudaLaunchKernel, host only\": %.1f", host_only_ns(n, [&] {
             cudaLaunchKernel((const void*)add1, dim3(1), dim3(256), args, 0, s);
           }));
  }
  if (argc > 2) {  // the backend's whole C call: checks, cudaSetDevice, pointer queries, the launch
    void* lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      printf(", \"backend\": \"dlopen failed: %s\"}\n", dlerror());
      return 1;
    }
    auto create = (create_fn)dlsym(lib, "cuplug_backend_create");
    auto call = (call_fn)dlsym(lib, "cuplug_backend_call");
    cuplug_backend* h = create ? create("0") : nullptr;
    if (h == nullptr || call == nullptr) {
      printf(", \"backend\": \"create failed\"}\n");
      return 1;
    }
    int64_t shape[1] = {1};
    cuplug_tensor t[3];
    float* ptrs[3] = {x, y, o};
    for (int k = 0; k < 3; ++k) t[k] = cuplug_tensor{ptrs[k], 2, 0, 1, {2, 32, 1}, shape, nullptr, 0};
    int rc = call(h, "add", t, 2, t + 2, 1, nullptr, 0, (uint64_t)(uintptr_t)s);
    printf(", \"backend add rc\": %d", rc);
    printf(", \"cuplug_backend_call add\": %.1f", median_ns(n, [&] { call(h, "add", t, 2, t + 2, 1, nullptr, 0, (uint64_t)(uintptr_t)s); }));
    printf(", \"cuplug_backend_call add, host only\": %.1f",
           host_only_ns(n, [&] { call(h, "add", t, 2, t + 2, 1, nullptr, 0, (uint64_t)(uintptr_t)s); }));
  }
  printf("}\n");
  return 0;
}
