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
constexpr int kReps = 4;  // 16-byte vectors per thread and tile: four loads in flight

// One input dtype: elements per 16-byte vector (as four 32-bit words w), the
// largest |x| of a vector as float32 ordered bits, element k widened to float.
// For the 16-bit types the maximum is taken on the 16-bit |x| patterns (two at a
// time with __vmaxu2) and widened once: widening is monotonic, NaN stays NaN.
struct F32 {
  using T = float;
  static constexpr int V = 4;
  __device__ static uint32_t max_bits(const uint32_t (&w)[4]) {
    return max(max(w[0] & 0x7FFFFFFFu, w[1] & 0x7FFFFFFFu), max(w[2] & 0x7FFFFFFFu, w[3] & 0x7FFFFFFFu));
  }
  __device__ static float at(const uint32_t (&w)[4], int k) { return __uint_as_float(w[k]); }
};
__device__ __forceinline__ uint32_t max_halves(const uint32_t (&w)[4]) {
  const uint32_t m = __vmaxu2(__vmaxu2(w[0] & 0x7FFF7FFFu, w[1] & 0x7FFF7FFFu),
                              __vmaxu2(w[2] & 0x7FFF7FFFu, w[3] & 0x7FFF7FFFu));
  return max(m & 0xFFFFu, m >> 16);
}
__device__ __forceinline__ uint16_t half_at(const uint32_t (&w)[4], int k) {
  return (uint16_t)(w[k / 2] >> (16 * (k % 2)));
}
struct F16 {
  using T = uint16_t;
  static constexpr int V = 8;
  __device__ static uint32_t max_bits(const uint32_t (&w)[4]) {
    return quant_abs_bits(quant_f16_to_float((uint16_t)max_halves(w)));
  }
  __device__ static float at(const uint32_t (&w)[4], int k) { return quant_f16_to_float(half_at(w, k)); }
};
struct BF16 {
  using T = uint16_t;
  static constexpr int V = 8;
  __device__ static uint32_t max_bits(const uint32_t (&w)[4]) { return max_halves(w) << 16; }
  __device__ static float at(const uint32_t (&w)[4], int k) { return quant_bf16_to_float(half_at(w, k)); }
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

// The V elements x[i..i+V) as raw words (zero bits past n): one 16-byte load when
// VEC and whole.
template <class D, bool VEC>
__device__ __forceinline__ void load(const typename D::T* x, long long i, long long n, uint32_t (&w)[4]) {
  if (VEC && i + D::V <= n) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x + i));
    w[0] = raw.x, w[1] = raw.y, w[2] = raw.z, w[3] = raw.w;
  } else {
    typename D::T items[D::V];
#pragma unroll
    for (int k = 0; k < D::V; ++k) items[k] = i + k < n ? x[i + k] : typename D::T(0);
    memcpy(w, items, sizeof w);
  }
}

// One CTA quantizes tiles of kTile = 256 threads x 4 vectors x V elements (4096
// float32, 8192 16-bit values): every thread loads its four vectors (coalesced,
// vector r*256 + thread) into registers, reduces each to its largest |x|, the
// lanes of a warp that share a quantization block combine theirs with xor shuffles
// and one of them does an atomicMax into the block's shared slot. After one
// barrier every thread scales and rounds its own elements. Since blocksize is a
// power of two dividing kTile, no block spans two tiles; x is read once, q
// written once, and the maximum (of ordered bits) is exact in any order.
template <class D, bool VEC>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const typename D::T* __restrict__ x, int8_t* __restrict__ q, float* __restrict__ absmax,
                    long long n, int log2_bs) {
  constexpr int V = D::V, kTile = kThreads * kReps * V, kSlots = kTile / QUANT_MIN_BLOCKSIZE;
  __shared__ uint32_t slot[kSlots];
  const int bs = 1 << log2_bs;
  const int seg = bs / V < 32 ? bs / V : 32;  // lanes of a warp row in one block
  const int lane = threadIdx.x % 32;
  const long long tiles = (n + kTile - 1) / kTile, blocks = (n + bs - 1) >> log2_bs;
  const int tile_blocks = kTile >> log2_bs;
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const long long base = tile * kTile;
    for (int i = threadIdx.x; i < tile_blocks; i += kThreads) slot[i] = 0;
    uint32_t w[kReps][4];
#pragma unroll
    for (int r = 0; r < kReps; ++r) load<D, VEC>(x, base + (long long)(r * kThreads + threadIdx.x) * V, n, w[r]);
    __syncthreads();  // slots cleared
#pragma unroll
    for (int r = 0; r < kReps; ++r) {
      uint32_t m = D::max_bits(w[r]);
      for (int off = seg / 2; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
      if ((lane & (seg - 1)) == 0) atomicMax(&slot[((r * kThreads + threadIdx.x) * V) >> log2_bs], m);
    }
    __syncthreads();  // slots complete
    for (int i = threadIdx.x; i < tile_blocks; i += kThreads) {
      const long long b = (base >> log2_bs) + i;
      if (b < blocks) absmax[b] = quant_absmax_from_bits(slot[i]);
    }
#pragma unroll
    for (int r = 0; r < kReps; ++r) {
      const int local = (r * kThreads + threadIdx.x) * V;
      const long long i = base + local;
      if (i >= n) continue;
      const float scale = quant_scale(quant_absmax_from_bits(slot[local >> log2_bs]));
      int8_t out[V];
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = quant_one(D::at(w[r], k), scale);
      if (VEC && i + V <= n) {
        typename Packed<V>::T packed;
        memcpy(&packed, out, sizeof packed);
        *reinterpret_cast<typename Packed<V>::T*>(q + i) = packed;
      } else {
        for (int k = 0; k < V && i + k < n; ++k) q[i + k] = out[k];
      }
    }
    __syncthreads();  // slots read before the next tile clears them
  }
}

// Tiles of 256 threads x 4 items of 4 int8 (one 4-byte load, one 16-byte store
// each, coalesced); the 4 share a block, since blocksize is a multiple of 4.
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const int8_t* __restrict__ q, const float* __restrict__ absmax, float* __restrict__ out,
                      long long n, int log2_bs) {
  constexpr int kTile = kThreads * kReps * 4;
  const long long tiles = (n + kTile - 1) / kTile;
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    uint32_t w[kReps];
    float a[kReps];
#pragma unroll
    for (int r = 0; r < kReps; ++r) {
      const long long i = tile * kTile + (long long)(r * kThreads + threadIdx.x) * 4;
      w[r] = 0, a[r] = 0.0f;
      if (i >= n) continue;
      a[r] = __ldg(absmax + (i >> log2_bs));
      if (VEC && i + 4 <= n) {
        w[r] = __ldg(reinterpret_cast<const uint32_t*>(q + i));
      } else {
        for (int k = 0; k < 4 && i + k < n; ++k) w[r] |= (uint32_t)(uint8_t)q[i + k] << (8 * k);
      }
    }
#pragma unroll
    for (int r = 0; r < kReps; ++r) {
      const long long i = tile * kTile + (long long)(r * kThreads + threadIdx.x) * 4;
      if (i >= n) continue;
      const float d = quant_dequant_scale(a[r]);
      float v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = quant_dequant_one((int8_t)(w[r] >> (8 * k)), d);
      if (VEC && i + 4 <= n) {
        *reinterpret_cast<float4*>(out + i) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
        for (int k = 0; k < 4 && i + k < n; ++k) out[i + k] = v[k];
      }
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

int log2_of(long long bs) {
  int k = 0;
  while ((1LL << k) < bs) ++k;
  return k;
}

template <class D>
int quantize_as(const cuplug_call* c, int log2_bs) {
  const auto* x = static_cast<const typename D::T*>(c->in[0].data);
  auto* q = static_cast<int8_t*>(c->out[0].data);
  auto* amax = static_cast<float*>(c->out[1].data);
  const long long tiles = (c->n + kThreads * kReps * D::V - 1) / (kThreads * kReps * D::V);
  const int grid = cuplug_cuda_full_grid(tiles * kThreads, kThreads);
  cudaStream_t stream = static_cast<cudaStream_t>(c->stream);
  if (aligned(x, 16) && aligned(q, D::V))
    quantize_kernel<D, true><<<grid, kThreads, 0, stream>>>(x, q, amax, c->n, log2_bs);
  else
    quantize_kernel<D, false><<<grid, kThreads, 0, stream>>>(x, q, amax, c->n, log2_bs);
  return launched(c, "quantize_blockwise launch");
}

int quantize_blockwise(const cuplug_call* c) {
  const long long bs = cuplug_attr_int(c, "blocksize");
  if (!quant_blocksize_ok(bs)) return cuplug_op_fail(c, "blocksize must be a power of two in [64, 4096], got %lld", bs);
  if (c->n == 0) return CUPLUG_OK;
  switch (cuplug_dtype_bit(c->in[0].dtype)) {
    case CUPLUG_F32:
      return quantize_as<F32>(c, log2_of(bs));
    case CUPLUG_F16:
      return quantize_as<F16>(c, log2_of(bs));
    case CUPLUG_BF16:
      return quantize_as<BF16>(c, log2_of(bs));
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
  const long long tiles = (c->n + kThreads * kReps * 4 - 1) / (kThreads * kReps * 4);
  const int grid = cuplug_cuda_full_grid(tiles * kThreads, kThreads);
  cudaStream_t stream = static_cast<cudaStream_t>(c->stream);
  if (aligned(q, 4) && aligned(out, 16))
    dequantize_kernel<true><<<grid, kThreads, 0, stream>>>(q, amax, out, c->n, log2_of(bs));
  else
    dequantize_kernel<false><<<grid, kThreads, 0, stream>>>(q, amax, out, c->n, log2_of(bs));
  return launched(c, "dequantize_blockwise launch");
}

}  // namespace quant_kernels

using quant_kernels::dequantize_blockwise;
using quant_kernels::quantize_blockwise;
#include "../common/quant_ops_table.h"
#include "cuplug_cuda_backend.cuh"
