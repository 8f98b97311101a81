// The CUDA side of the `scan` backend: the op table and its launch functions. The
// prefix-sum kernels are in scan_kernels.cu (a second translation unit, reached
// through scan_kernels.h on INCLUDE_DIRS); segment_sum reads float16 through
// cuda_fp16.h. cuplug's cuplug_cuda_backend.cuh supplies the whole C ABI around the table.
#include <cuda_fp16.h>  // __half: needs the toolchain's CCCL (nv/target) on CUDA 12 too
#include <cuda_runtime.h>

#include "cuplug_ops.h"
#include "scan_kernels.h"

namespace scan_kernels {

constexpr int kThreads = 256;

int prefix_sum(const cuplug_call* c) {
  if (c->n == 0) return CUPLUG_OK;
  float* scratch = static_cast<float*>(cuplug_cuda_scratch(c, sizeof(float) * (size_t)scratch_floats(c->n)));
  if (scratch == nullptr) return CUPLUG_E_OUT_OF_MEMORY;
  scan(static_cast<const float*>(c->in[0].data), static_cast<float*>(c->out[0].data), c->n, scratch,
       (cudaStream_t)c->stream);
  return CUPLUG_OK;
}

// Sums of consecutive segments of `segment` elements, accumulated in float32 from
// float16 or float32 input: one block per segment, whole 256-element tiles.
template <typename T>
__device__ __forceinline__ float as_float(T v) { return (float)v; }
template <>
__device__ __forceinline__ float as_float<__half>(__half v) { return __half2float(v); }

template <typename T>
__global__ void segment_sum_kernel(const T* __restrict__ x, float* __restrict__ out, long long segment) {
  __shared__ float partial[kThreads];
  const T* seg = x + (long long)blockIdx.x * segment;
  float acc = 0.0f;
  for (long long i = threadIdx.x; i < segment; i += kThreads) acc += as_float(seg[i]);
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {  // a fixed order: the same bits on every run
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

int segment_sum(const cuplug_call* c) {
  const long long segment = cuplug_attr_int(c, "segment");
  if (segment <= 0 || segment % 256 != 0 || c->n % segment != 0)
    return cuplug_op_fail(c, "segment_sum: segment must be a positive multiple of 256 dividing n=%lld, got %lld",
                          c->n, segment);
  const long long segments = c->n / segment;
  if (segments == 0) return CUPLUG_OK;
  cudaStream_t stream = (cudaStream_t)c->stream;
  float* out = static_cast<float*>(c->out[0].data);
  if (c->in[0].dtype.bits == 16)
    segment_sum_kernel<__half><<<(unsigned)segments, kThreads, 0, stream>>>(
        static_cast<const __half*>(c->in[0].data), out, segment);
  else
    segment_sum_kernel<float><<<(unsigned)segments, kThreads, 0, stream>>>(
        static_cast<const float*>(c->in[0].data), out, segment);
  return CUPLUG_OK;
}

}  // namespace scan_kernels

// prefix_sum: float32 in, float32 out (any n). segment_sum: float16/float32 in, one
// float32 per `segment` elements; a size rule (n a multiple of 256, at least 256)
// checked by the loader before the call, and the op's own message for a bad segment.
static const cuplug_op cuplug_ops[] = {
    {"prefix_sum", scan_kernels::prefix_sum, 0, {CUPLUG_IN("x", CUPLUG_F32)}, {CUPLUG_OUT_LIKE("out", 0)}},
    {"segment_sum", scan_kernels::segment_sum, 0,
     {CUPLUG_IN("x", CUPLUG_F16 | CUPLUG_F32)},
     {CUPLUG_OUT("sums", CUPLUG_DT_FIXED, CUPLUG_F32, CUPLUG_SHAPE_BLOCKS, 0, "segment")},
     {CUPLUG_ATTR_INT("segment", 4096)},
     {CUPLUG_SIZE(0, 256, 256, 0)},
     4096},
};

#include "cuplug_cuda_backend.cuh"
