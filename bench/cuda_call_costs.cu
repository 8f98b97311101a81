// What the host pays per CUDA runtime/driver call that a cuplug backend call makes, on 1-element work:
// the launch itself, cudaSetDevice, and the pointer queries of the device-tensor check
// (backends/common/cuplug_cuda_backend.cuh, check_device_tensor). Median of 7 loops of N calls, ns.
//
//   nvcc -O2 -o /tmp/costs bench/cuda_call_costs.cu -lcuda && /tmp/costs [N]
#include <cuda.h>
#include <cuda_runtime.h>

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
  printf("}\n");
  return 0;
}
