// The reference "vector" backend on CUDA: its kernels and its op table. The C
// ABI around them (context, streams, host staging, buffers, errors) comes from
// cuplug_cuda_backend.cuh, as it does for any author's backend.
#include <cuda_runtime.h>

#include "cuplug_ops.h"

namespace vector_kernels {  // named: cudafe++ gives anonymous namespaces a random id

constexpr int kThreads = 256;

// ---- kernels: grid-stride, 16-byte loads on the aligned body, scalar tail ----

__global__ void add_kernel(const float* __restrict__ x, const float* __restrict__ y,
                           float* __restrict__ out, long long n) {
  const long long n4 = n / 4;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const float4* y4 = reinterpret_cast<const float4*>(y);
  float4* o4 = reinterpret_cast<float4*>(out);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 a = x4[i], b = y4[i];
    o4[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
  for (long long i = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = x[i] + y[i];
}

// alpha * x + beta rounded twice, never fused into one FMA: the same bits as the
// CPU backend (and IEEE float32 on any host), so backends agree exactly.
__device__ __forceinline__ float scale_add1(float alpha, float x, float beta) {
  return __fadd_rn(__fmul_rn(alpha, x), beta);
}

__global__ void scale_add_kernel(const float* __restrict__ x, float alpha, float beta,
                                 float* __restrict__ out, long long n) {
  const long long n4 = n / 4;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4* o4 = reinterpret_cast<float4*>(out);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 a = x4[i];
    o4[i] = make_float4(scale_add1(alpha, a.x, beta), scale_add1(alpha, a.y, beta),
                        scale_add1(alpha, a.z, beta), scale_add1(alpha, a.w, beta));
  }
  for (long long i = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = scale_add1(alpha, x[i], beta);
}

// Pass 1 of a deterministic sum: each block writes one float64 partial.
__global__ void sum_partials_kernel(const float* __restrict__ x, long long n,
                                    double* __restrict__ partials) {
  __shared__ double shared[kThreads];
  const long long n4 = n / 4;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  double acc = 0.0;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 a = x4[i];
    acc += (double)a.x + (double)a.y + (double)a.z + (double)a.w;
  }
  for (long long i = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    acc += x[i];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// Pass 2: one block folds the partials in a fixed order.
__global__ void sum_final_kernel(const double* __restrict__ partials, int count,
                                 float* __restrict__ out) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = (float)shared[0];
}

int add(const cuplug_call* c) {
  add_kernel<<<cuplug_cuda_full_grid(c->n / 4, kThreads), kThreads, 0, (cudaStream_t)c->stream>>>(c->x, c->y, c->out,
                                                                                                  c->n);
  return CUPLUG_OK;
}

int scale_add(const cuplug_call* c) {
  scale_add_kernel<<<cuplug_cuda_full_grid(c->n / 4, kThreads), kThreads, 0, (cudaStream_t)c->stream>>>(
      c->x, c->alpha, c->beta, c->out, c->n);
  return CUPLUG_OK;
}

// Deterministic: a fixed grid for a given n, float64 partials folded in one order.
int sum(const cuplug_call* c) {
  int blocks = cuplug_cuda_blocks(c, c->n / 4, kThreads);
  double* partials = static_cast<double*>(cuplug_cuda_scratch(c, sizeof(double) * blocks));
  if (partials == nullptr) return CUPLUG_E_OUT_OF_MEMORY;
  cudaStream_t stream = (cudaStream_t)c->stream;
  sum_partials_kernel<<<blocks, kThreads, 0, stream>>>(c->x, c->n, partials);
  sum_final_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, c->out);
  return CUPLUG_OK;
}

}  // namespace vector_kernels

static const cuplug_op cuplug_ops[] = {
    {"add", 2, CUPLUG_OUT_N, 1, vector_kernels::add},
    {"scale_add", 1, CUPLUG_OUT_N, 1, vector_kernels::scale_add},
    {"sum", 1, CUPLUG_OUT_ONE, 0, vector_kernels::sum},
};

#include "cuplug_cuda_backend.cuh"
