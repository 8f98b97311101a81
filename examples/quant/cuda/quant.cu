// The CUDA side of the `quant` backend: blockwise absmax int8 quantization (as in
// 8-bit optimizers and weight quantization). Kernels and an op table; cuplug's
// cuplug_cuda_backend.cuh supplies the whole C ABI around them. The arithmetic is
// ../common/quant_math.h, shared with the CPU twin: both give the same bits.
//
// No cuda_fp16.h / cuda_bf16.h: float16 is widened with one PTX cvt, bfloat16 by
// a shift, so the CUDA 12.4 toolchain (whose CCCL headers it cannot compile) and
// 13.0 build the same source.
#include <cuda_runtime.h>
#include <stdint.h>

#include "../common/quant_math.h"
#include "cuplug_ops.h"

namespace quant_kernels {  // named: cudafe++ gives anonymous namespaces a random id

constexpr int kThreads = 256;

// One input dtype: its storage type, elements per 16-byte vector, widening to float.
struct F32 {
  using T = float;
  static constexpr int V = 4;
  static constexpr int R = QUANT_MAX_BLOCKSIZE / (kThreads * V);  // vectors per thread at most
  __device__ static float widen(T v) { return v; }
};
struct F16 {
  using T = uint16_t;
  static constexpr int V = 8;
  static constexpr int R = QUANT_MAX_BLOCKSIZE / (kThreads * V);
  __device__ static float widen(T v) { return quant_f16_to_float(v); }
};
struct BF16 {
  using T = uint16_t;
  static constexpr int V = 8;
  static constexpr int R = QUANT_MAX_BLOCKSIZE / (kThreads * V);
  __device__ static float widen(T v) { return quant_bf16_to_float(v); }
};

template <int V>
struct Packed;  // V int8 in one store
template <>
struct Packed<4> {
  using T = uint32_t;
};
template <>
struct Packed<8> {
  using T = uint2;
};

// V elements from x[i..i+V) (zeros past n): one 16-byte load when VEC and whole.
template <class D, bool VEC>
__device__ __forceinline__ void load(const typename D::T* x, long long i, long long n, float (&v)[D::V]) {
  if (VEC && i + D::V <= n) {
    const uint4 raw = *reinterpret_cast<const uint4*>(x + i);
    typename D::T items[D::V];
    memcpy(items, &raw, sizeof raw);
#pragma unroll
    for (int k = 0; k < D::V; ++k) v[k] = D::widen(items[k]);
  } else {
#pragma unroll
    for (int k = 0; k < D::V; ++k) v[k] = i + k < n ? D::widen(x[i + k]) : 0.0f;
  }
}

// Quantizes the `blocksize` elements of each quantization block with a group of
// g = min(blocksize / V, 256) threads (a power of two): each thread loads R =
// blocksize / (g * V) vectors, coalesced across the group, into registers; the
// group's maximum of |x| (as ordered bits) comes from warp shuffles (and, for
// groups wider than a warp, one shared-memory step); then each thread scales and
// rounds its own elements. x is read once, q written once.
template <class D, bool VEC>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const typename D::T* __restrict__ x, int8_t* __restrict__ q, float* __restrict__ absmax,
                    long long n, long long blocks, int blocksize) {
  constexpr int V = D::V;
  const int vecs = blocksize / V;
  const int g = vecs < kThreads ? vecs : kThreads;
  const int reps = vecs / g;
  const int per_cta = kThreads / g;
  const int group = threadIdx.x / g, lane = threadIdx.x % g;
  const int warp_lanes = g < 32 ? g : 32;
  __shared__ uint32_t warp_max[kThreads / 32];
  const long long supers = (blocks + per_cta - 1) / per_cta;
  for (long long s = blockIdx.x; s < supers; s += gridDim.x) {
    const long long b = s * per_cta + group;
    const long long start = b * blocksize;
    float v[D::R][V];
    uint32_t m = 0;
#pragma unroll
    for (int r = 0; r < D::R; ++r) {
      if (r < reps) {
        load<D, VEC>(x, start + (long long)(r * g + lane) * V, b < blocks ? n : 0, v[r]);
#pragma unroll
        for (int k = 0; k < V; ++k) m = max(m, quant_abs_bits(v[r][k]));
      }
    }
    for (int off = warp_lanes / 2; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    if (g > 32) {
      if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
      __syncthreads();
      const int first = group * (g / 32);
      for (int w = 0; w < g / 32; ++w) m = max(m, warp_max[first + w]);
      __syncthreads();  // warp_max is written again in the next round
    }
    if (b >= blocks) continue;
    const float amax = quant_absmax_from_bits(m);
    const float scale = quant_scale(amax);
    if (lane == 0) absmax[b] = amax;
#pragma unroll
    for (int r = 0; r < D::R; ++r) {
      if (r < reps) {
        const long long i = start + (long long)(r * g + lane) * V;
        int8_t out[V];
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] = quant_one(v[r][k], scale);
        if (VEC && i + V <= n) {
          typename Packed<V>::T packed;
          memcpy(&packed, out, sizeof packed);
          *reinterpret_cast<typename Packed<V>::T*>(q + i) = packed;
        } else {
          for (int k = 0; k < V && i + k < n; ++k) q[i + k] = out[k];
        }
      }
    }
  }
}

// 16 int8 per thread and step (one 16-byte load, four 16-byte stores); the 16
// share a block, since blocksize is a multiple of 16.
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const int8_t* __restrict__ q, const float* __restrict__ absmax, float* __restrict__ out,
                      long long n, int log2_blocksize) {
  constexpr int V = 16;
  const long long vecs = (n + V - 1) / V;
  for (long long t = blockIdx.x * (long long)kThreads + threadIdx.x; t < vecs; t += (long long)gridDim.x * kThreads) {
    const long long i = t * V;
    const float dscale = quant_dequant_scale(absmax[i >> log2_blocksize]);
    if (VEC && i + V <= n) {
      const uint4 raw = *reinterpret_cast<const uint4*>(q + i);
      int8_t items[V];
      memcpy(items, &raw, sizeof raw);
      float4* dst = reinterpret_cast<float4*>(out + i);
#pragma unroll
      for (int k = 0; k < V; k += 4)
        dst[k / 4] = make_float4(quant_dequant_one(items[k], dscale), quant_dequant_one(items[k + 1], dscale),
                                 quant_dequant_one(items[k + 2], dscale), quant_dequant_one(items[k + 3], dscale));
    } else {
      for (int k = 0; k < V && i + k < n; ++k) out[i + k] = quant_dequant_one(q[i + k], dscale);
    }
  }
}

bool aligned(const void* p, unsigned bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int launched(const cuplug_call* c, const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return CUPLUG_OK;
  if (c->error != nullptr && c->error_len > 0)
    snprintf(c->error, c->error_len, "%s: %s", what, cudaGetErrorString(err));
  return err == cudaErrorNoKernelImageForDevice ? CUPLUG_E_NO_KERNEL_IMAGE : CUPLUG_E_DEVICE;
}

template <class D>
int quantize_as(const cuplug_call* c, long long blocks, int blocksize) {
  const auto* x = static_cast<const typename D::T*>(c->in[0].data);
  auto* q = static_cast<int8_t*>(c->out[0].data);
  auto* amax = static_cast<float*>(c->out[1].data);
  const int g = blocksize / D::V < kThreads ? blocksize / D::V : kThreads;
  const long long supers = (blocks + kThreads / g - 1) / (kThreads / g);
  const int grid = cuplug_cuda_full_grid(supers * kThreads, kThreads);
  cudaStream_t stream = static_cast<cudaStream_t>(c->stream);
  if (aligned(x, 16) && aligned(q, D::V))
    quantize_kernel<D, true><<<grid, kThreads, 0, stream>>>(x, q, amax, c->n, blocks, blocksize);
  else
    quantize_kernel<D, false><<<grid, kThreads, 0, stream>>>(x, q, amax, c->n, blocks, blocksize);
  return launched(c, "quantize_blockwise launch");
}

int quantize_blockwise(const cuplug_call* c) {
  const long long bs = cuplug_attr_int(c, "blocksize");
  if (!quant_blocksize_ok(bs)) return cuplug_op_fail(c, "blocksize must be a power of two in [64, 4096], got %lld", bs);
  if (c->n == 0) return CUPLUG_OK;
  const long long blocks = (c->n + bs - 1) / bs;
  switch (cuplug_dtype_bit(c->in[0].dtype)) {
    case CUPLUG_F32:
      return quantize_as<F32>(c, blocks, (int)bs);
    case CUPLUG_F16:
      return quantize_as<F16>(c, blocks, (int)bs);
    case CUPLUG_BF16:
      return quantize_as<BF16>(c, blocks, (int)bs);
    default:
      return cuplug_op_fail(c, "x must be float16, bfloat16 or float32, got %s", cuplug_dtype_name(c->in[0].dtype));
  }
}

int dequantize_blockwise(const cuplug_call* c) {
  const long long bs = cuplug_attr_int(c, "blocksize");
  if (!quant_blocksize_ok(bs)) return cuplug_op_fail(c, "blocksize must be a power of two in [64, 4096], got %lld", bs);
  const long long blocks = (c->n + bs - 1) / bs, have = cuplug_numel(&c->in[1]);
  if (have != blocks)
    return cuplug_op_fail(c, "absmax has %lld elements; q of %lld elements in blocks of %lld needs %lld", have, c->n,
                          bs, blocks);
  if (c->n == 0) return CUPLUG_OK;
  const auto* q = static_cast<const int8_t*>(c->in[0].data);
  const auto* amax = static_cast<const float*>(c->in[1].data);
  auto* out = static_cast<float*>(c->out[0].data);
  int log2_bs = 0;
  while ((1LL << log2_bs) < bs) ++log2_bs;
  const int grid = cuplug_cuda_full_grid((c->n + 15) / 16, kThreads);
  cudaStream_t stream = static_cast<cudaStream_t>(c->stream);
  if (aligned(q, 16) && aligned(out, 16))
    dequantize_kernel<true><<<grid, kThreads, 0, stream>>>(q, amax, out, c->n, log2_bs);
  else
    dequantize_kernel<false><<<grid, kThreads, 0, stream>>>(q, amax, out, c->n, log2_bs);
  return launched(c, "dequantize_blockwise launch");
}

}  // namespace quant_kernels

using quant_kernels::dequantize_blockwise;
using quant_kernels::quantize_blockwise;
#include "../common/quant_ops_table.h"
#include "cuplug_cuda_backend.cuh"
