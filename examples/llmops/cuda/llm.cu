// The CUDA variants of `llm`: four kernels of the kind public ports needed (issue 32). The CUB block
// reductions (cub::BlockReduce) come with the pinned toolkit's CCCL; cuplug_cuda_backend.cuh supplies the
// whole C ABI around the ops. Every op launches on the call's stream and returns the launch's status.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <cub/block/block_reduce.cuh>

#include "cuplug_ops.h"

namespace llm_kernels {

constexpr int kThreads = 256;

int launched(const cuplug_call* c, const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return CUPLUG_OK;
  snprintf(c->error, c->error_len, "%s: %s", what, cudaGetErrorString(err));
  return err == cudaErrorNoKernelImageForDevice ? CUPLUG_E_NO_KERNEL_IMAGE : CUPLUG_E_DEVICE;
}

long long last_dim(const cuplug_tensor& t) { return t.ndim ? t.shape[t.ndim - 1] : 1; }

struct MaxOp {  // (cub::Max left CCCL in 3.0: a functor of our own serves CUDA 12.4 and 13.0 alike)
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// One block per row: the row's mean and variance through CUB block reductions, then y = (x - mean) * rstd * w + b.
__global__ void __launch_bounds__(kThreads) layernorm_kernel(const float* x, const float* w, const float* b, float* y,
                                                              float* mean, float* rstd, long long C, float eps) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float s_mean, s_rstd;
  const long long row = blockIdx.x;
  const float* xr = x + row * C;
  float s = 0.f;
  for (long long i = threadIdx.x; i < C; i += kThreads) s += xr[i];
  const float total = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) s_mean = total / (float)C;
  __syncthreads();  // (also before the temp storage is used again)
  const float m = s_mean;
  float v = 0.f;
  for (long long i = threadIdx.x; i < C; i += kThreads) {
    const float d = xr[i] - m;
    v += d * d;
  }
  const float var = Reduce(tmp).Sum(v);
  if (threadIdx.x == 0) {
    s_rstd = rsqrtf(var / (float)C + eps);
    mean[row] = m;
    rstd[row] = s_rstd;
  }
  __syncthreads();
  const float r = s_rstd;
  for (long long i = threadIdx.x; i < C; i += kThreads) y[row * C + i] = (xr[i] - m) * r * w[i] + b[i];
}

// A histogram of bytes: per-block counts in shared memory, added to the output once per block.
__global__ void __launch_bounds__(kThreads) histogram_kernel(const uint8_t* x, long long n, uint32_t* hist, int bins) {
  __shared__ uint32_t counts[256];
  for (int i = threadIdx.x; i < 256; i += kThreads) counts[i] = 0;
  __syncthreads();
  for (long long i = blockIdx.x * (long long)kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads) {
    const unsigned v = x[i];
    if (v < (unsigned)bins) atomicAdd(&counts[v], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256 && i < bins; i += kThreads)
    if (counts[i]) atomicAdd(&hist[i], counts[i]);
}

__global__ void __launch_bounds__(kThreads) gelu_kernel(const __nv_bfloat16* x, __nv_bfloat16* out, long long n) {
  for (long long i = blockIdx.x * (long long)kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads) {
    const float v = __bfloat162float(x[i]);
    out[i] = __float2bfloat16_rn(0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))));
  }
}

// One block per row: the row's maximum and the sum of exp(x - max) through CUB block reductions.
__global__ void __launch_bounds__(kThreads) softmax_kernel(const float* x, float* out, long long C) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float s_max, s_sum;
  const long long row = blockIdx.x;
  const float* xr = x + row * C;
  float m = -INFINITY;
  for (long long i = threadIdx.x; i < C; i += kThreads) m = fmaxf(m, xr[i]);
  const float rmax = Reduce(tmp).Reduce(m, MaxOp());
  if (threadIdx.x == 0) s_max = rmax;
  __syncthreads();
  float s = 0.f;
  for (long long i = threadIdx.x; i < C; i += kThreads) s += expf(xr[i] - s_max);
  const float sum = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) s_sum = sum;
  __syncthreads();
  for (long long i = threadIdx.x; i < C; i += kThreads) out[row * C + i] = expf(xr[i] - s_max) / s_sum;
}

int rows_of(const cuplug_call* c, const char* op, long long* rows, long long* C) {
  *C = last_dim(c->in[0]);
  if (*C == 0) return cuplug_op_fail(c, "%s: x's last dimension is 0: no row to reduce", op);
  *rows = c->n / *C;
  if (*rows > 0x7fffffffLL) return cuplug_op_fail(c, "%s: %lld rows, more than one launch takes", op, *rows);
  return CUPLUG_OK;
}

int layernorm(const cuplug_call* c) {
  long long rows = 0, C = 0;
  if (int rc = rows_of(c, "layernorm", &rows, &C)) return rc;
  if (rows == 0) return CUPLUG_OK;
  cudaStream_t stream = static_cast<cudaStream_t>(c->stream);
  layernorm_kernel<<<(unsigned)rows, kThreads, 0, stream>>>(
      static_cast<const float*>(c->in[0].data), static_cast<const float*>(c->in[1].data),
      static_cast<const float*>(c->in[2].data), static_cast<float*>(c->out[0].data),
      static_cast<float*>(c->out[1].data), static_cast<float*>(c->out[2].data), C,
      (float)cuplug_attr_float(c, "eps"));
  return launched(c, "layernorm launch");
}

int histogram(const cuplug_call* c) {
  const long long bins = c->out[0].shape[0];
  if (bins > 0x7fffffffLL) return cuplug_op_fail(c, "histogram: %lld bins, more than an int holds", bins);
  cudaStream_t stream = static_cast<cudaStream_t>(c->stream);
  if (bins == 0) return CUPLUG_OK;
  if (cudaMemsetAsync(c->out[0].data, 0, sizeof(uint32_t) * (size_t)bins, stream) != cudaSuccess)
    return launched(c, "histogram memset");
  if (c->n == 0) return CUPLUG_OK;
  const int grid = cuplug_cuda_full_grid(c->n, kThreads);
  histogram_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(c->in[0].data), c->n,
                                                  static_cast<uint32_t*>(c->out[0].data), (int)bins);
  return launched(c, "histogram launch");
}

int gelu(const cuplug_call* c) {
  if (c->n == 0) return CUPLUG_OK;
  cudaStream_t stream = static_cast<cudaStream_t>(c->stream);
  gelu_kernel<<<cuplug_cuda_full_grid(c->n, kThreads), kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(c->in[0].data), static_cast<__nv_bfloat16*>(c->out[0].data), c->n);
  return launched(c, "gelu launch");
}

int softmax(const cuplug_call* c) {
  long long rows = 0, C = 0;
  if (int rc = rows_of(c, "softmax", &rows, &C)) return rc;
  if (rows == 0) return CUPLUG_OK;
  cudaStream_t stream = static_cast<cudaStream_t>(c->stream);
  softmax_kernel<<<(unsigned)rows, kThreads, 0, stream>>>(static_cast<const float*>(c->in[0].data),
                                                          static_cast<float*>(c->out[0].data), C);
  return launched(c, "softmax launch");
}

}  // namespace llm_kernels

using llm_kernels::gelu;
using llm_kernels::histogram;
using llm_kernels::layernorm;
using llm_kernels::softmax;

#include "../common/llm_ops_table.h"
#include "cuplug_cuda_backend.cuh"
