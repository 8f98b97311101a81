// Element types of cuplug's dtypes in CUDA device code, without <cuda_fp16.h> or
// <cuda_bf16.h> (they pull in CCCL, which not every toolchain ships): float16 and
// bfloat16 are 16-bit storage types here, converted with the hardware's cvt
// instructions where the arch has them and with bit-exact integer code
// otherwise; every conversion to a 16-bit type rounds to nearest even, as
// PyTorch's and NumPy's do.
//
//   cuplug_types::f16 / bf16          16-bit storage (member `bits`)
//   to_f32(h), f32_to_f16(f), f32_to_bf16(f)
//   cuplug_dispatch(dtype, [&](auto tag) { using T = typename decltype(tag)::type; ... })
//       runs the lambda with T = f16, bf16, float, double, int8_t, uint8_t, int32_t, int64_t.
#ifndef CUPLUG_CUDA_TYPES_CUH
#define CUPLUG_CUDA_TYPES_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "cuplug_ops.h"

namespace cuplug_types {

struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

__host__ __device__ __forceinline__ uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

__host__ __device__ __forceinline__ float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// float32 -> bfloat16, round to nearest even; NaN -> 0x7fff (what cvt.rn.bf16.f32
// and CUDA's __float2bfloat16 give). Subnormals are kept (bfloat16 has float32's
// exponent range, so they round like normals). Exact on every arch.
__host__ __device__ __forceinline__ uint16_t f32_to_bf16_bits_soft(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // no overflow: u <= 0xff800000 here
}

__host__ __device__ __forceinline__ float to_f32(bf16 b) { return bits_float((uint32_t)b.bits << 16); }

#ifdef __CUDACC__
__device__ __forceinline__ float to_f32(f16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));  // exact
  return f;
}
__device__ __forceinline__ f16 f32_to_f16(float f) {
  f16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
  bf16 b;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(f));
#else
  b.bits = f32_to_bf16_bits_soft(f);
#endif
  return b;
}
// Two float32 -> two bfloat16 in one word: `lo` in bits 0..15, `hi` in 16..31.
__device__ __forceinline__ uint32_t f32x2_to_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // first source -> upper half
  return r;
#else
  return (uint32_t)f32_to_bf16_bits_soft(lo) | ((uint32_t)f32_to_bf16_bits_soft(hi) << 16);
#endif
}
#endif  // __CUDACC__

template <class T>
struct Tag {
  using type = T;
};

// Runs f(Tag<T>()) for the element type T of dtype d, instantiated for the dtypes of Mask only (default: the
// numeric eight, what most kernels take; CUPLUG_ALL_DTYPES adds uint16/32/64 and bool); CUPLUG_E_INVALID_ARGUMENT for a dtype outside Mask (the signature check refuses those first).
template <unsigned Mask = CUPLUG_NUMERIC, class F>
int cuplug_dispatch(cuplug_dtype d, F&& f) {
#define CUPLUG_CASE(bit, T) \
  case bit:                 \
    if constexpr ((Mask & bit) != 0) return f(Tag<T>()); \
    break;
  switch (cuplug_dtype_bit(d)) {
    CUPLUG_CASE(CUPLUG_F16, f16)
    CUPLUG_CASE(CUPLUG_BF16, bf16)
    CUPLUG_CASE(CUPLUG_F32, float)
    CUPLUG_CASE(CUPLUG_F64, double)
    CUPLUG_CASE(CUPLUG_I8, int8_t)
    CUPLUG_CASE(CUPLUG_U8, uint8_t)
    CUPLUG_CASE(CUPLUG_I32, int32_t)
    CUPLUG_CASE(CUPLUG_I64, int64_t)
    CUPLUG_CASE(CUPLUG_U16, uint16_t)
    CUPLUG_CASE(CUPLUG_U32, uint32_t)
    CUPLUG_CASE(CUPLUG_U64, uint64_t)
    CUPLUG_CASE(CUPLUG_BOOL, bool)
    default: break;
  }
#undef CUPLUG_CASE
  return CUPLUG_E_INVALID_ARGUMENT;
}

}  // namespace cuplug_types

#endif  // CUPLUG_CUDA_TYPES_CUH
