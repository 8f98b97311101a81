/*
 * The arithmetic of blockwise absmax int8 quantization, shared by the CUDA
 * kernels (cuda/quant.cu) and the CPU twin (cpu/quant_cpu.c) so that both give
 * the same bits. Every float operation here is one IEEE-754 binary32 operation
 * rounded to nearest even (no FMA, no flush to zero):
 *
 *   absmax[b] = max |float32(x_i)| over block b (NaN if the block holds a NaN;
 *               every NaN is written as the quiet NaN 0x7FC00000)
 *   scale     = 127.0f / absmax[b]                       (one division per block)
 *   p         = float32(x_i) * scale                     (one multiplication)
 *   q_i       = 0 if p is NaN, else round_half_to_even(clamp(p, -127, 127))
 *
 *   dequant:  out_i = float32(q_i) * (absmax[b] / 127.0f)     (NaN written 0x7FC00000)
 *
 * The cases fall out of the formula: absmax 0 -> scale +inf, p = 0 * inf = NaN,
 * q = 0; absmax +inf -> scale 0, q = 0 (and an infinite x gives inf * 0 = NaN,
 * q = 0); a NaN anywhere in the block -> absmax NaN, scale NaN, the block's q all
 * 0 (it dequantizes to NaN: 0 * NaN); a subnormal absmax whose scale overflows
 * -> the nonzero x of the block saturate to +-127.
 */
#ifndef QUANT_MATH_H
#define QUANT_MATH_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define QUANT_HD __host__ __device__ __forceinline__
#else
#define QUANT_HD static inline
#endif

#define QUANT_MIN_BLOCKSIZE 64
#define QUANT_MAX_BLOCKSIZE 4096
#define QUANT_CANONICAL_NAN 0x7FC00000u

/* A blocksize the ops accept: a power of two in [64, 4096]. */
QUANT_HD int quant_blocksize_ok(long long bs) {
    return bs >= QUANT_MIN_BLOCKSIZE && bs <= QUANT_MAX_BLOCKSIZE && (bs & (bs - 1)) == 0;
}

QUANT_HD uint32_t quant_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

QUANT_HD float quant_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* bfloat16 bits -> float32: exact (the upper half of a float32). */
QUANT_HD float quant_bf16_to_float(uint16_t h) { return quant_float((uint32_t)h << 16); }

/* IEEE float16 bits -> float32: exact for every finite value and infinity. */
QUANT_HD float quant_f16_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0x1Fu) return quant_float(sign | 0x7F800000u | (man << 13)); /* inf, NaN */
    if (exp != 0) return quant_float(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float32 */
    return quant_float(sign | quant_bits((float)man * 5.9604644775390625e-8f));
#endif
}

/* |x| as ordered bits: for non-negative floats the unsigned order of the bit
 * patterns is the numeric order, and every NaN sorts above +inf, so the block
 * maximum of these is exact, independent of the reduction order and NaN-sticky. */
QUANT_HD uint32_t quant_abs_bits(float x) { return quant_bits(x) & 0x7FFFFFFFu; }

/* The absmax of a block from the maximum of quant_abs_bits (canonical NaN). */
QUANT_HD float quant_absmax_from_bits(uint32_t m) {
    return quant_float(m > 0x7F800000u ? QUANT_CANONICAL_NAN : m);
}

QUANT_HD float quant_scale(float absmax) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(127.0f, absmax);
#else
    return 127.0f / absmax;
#endif
}

QUANT_HD int8_t quant_one(float x, float scale) {
#ifdef __CUDA_ARCH__
    float p = __fmul_rn(x, scale);
#else
    float p = x * scale;
#endif
    if (p != p) return 0;
    p = p > 127.0f ? 127.0f : (p < -127.0f ? -127.0f : p);
#ifdef __CUDA_ARCH__
    return (int8_t)__float2int_rn(p);
#else
    /* round half to even: adding 1.5 * 2^23 pushes the fraction out (|p| <= 127)
     * in the default rounding mode; no libm (the build has no -ffast-math that
     * could fold it). */
    return (int8_t)(int)((p + 12582912.0f) - 12582912.0f);
#endif
}

QUANT_HD float quant_dequant_scale(float absmax) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(absmax, 127.0f);
#else
    return absmax / 127.0f;
#endif
}

/* A NaN result is written as 0x7FC00000 (the GPU's own NaN is 0x7FFFFFFF, x86's
 * propagates the operand's): the same bits everywhere. */
QUANT_HD float quant_dequant_one(int8_t q, float dscale) {
#ifdef __CUDA_ARCH__
    const float r = __fmul_rn((float)q, dscale);
#else
    const float r = (float)q * dscale;
#endif
    return r != r ? quant_float(QUANT_CANONICAL_NAN) : r;
}

#endif /* QUANT_MATH_H */
