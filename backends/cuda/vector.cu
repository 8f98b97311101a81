// The reference "vector" backend on CUDA: its kernels and its op table. The C
// ABI around them (context, streams, host staging, resident tensors, errors)
// comes from cuplug_cuda_backend.cuh, as it does for any author's backend.
//
// Every op takes any of cuplug's 8 dtypes; results are bit-exact with PyTorch's
// (and with the CPU twin) for add and scale_add:
//   add        f16/bf16: float32 sum rounded to nearest even (= __hadd); f32/f64
//              IEEE; integers wrap around.
//   scale_add  x * alpha + beta rounded twice, never fused: f16/bf16
//              t = round(float(x) * (float)alpha), out = round(float(t) + (float)beta);
//              f32 the same in float32, f64 in float64; integers need integral
//              alpha and beta and compute (T)(x * (int64)alpha + (int64)beta),
//              wrapping around.
//   sum        deterministic (a fixed grid for a given n and device, fixed-order
//              folds: the same bits on every run): f32/f64 accumulate in float64,
//              f16/bf16 in float32, integers in int64 (wrapping); the result is
//              written as the output dtype (integers -> int64); n == 0 gives 0.
#include <cuda_runtime.h>
#include <math.h>

#include <type_traits>

#include "cuplug_cuda_types.cuh"
#include "cuplug_ops.h"

namespace vector_kernels {  // named: cudafe++ gives anonymous namespaces a random id

using namespace cuplug_types;

constexpr int kThreads = 256;

// Tuning knobs (compile-time). The defaults are what the H200 chose (2026-12-03, 1 GiB
// tensors, CUDA-event medians interleaved with PyTorch's): one vector per thread on
// the full grid for elementwise ops (2 or 4 were 0.5-1% slower); for sum, 8 vectors in
// flight per thread and 3 blocks of 256 per SM (96 KiB of loads in flight per SM,
// ~4.17 TB/s, 1.02-1.03x torch.sum; 4 vectors x 4 blocks was 0.99-1.05x).
#ifndef CUPLUG_VECTOR_EW_VECS
#define CUPLUG_VECTOR_EW_VECS 1  // 16-byte vectors per thread and array in the elementwise kernel
#endif
#ifndef CUPLUG_VECTOR_SUM_UNROLL
#define CUPLUG_VECTOR_SUM_UNROLL 8  // 16-byte vectors in flight per thread and iteration in sum
#endif
#ifndef CUPLUG_VECTOR_SUM_BLOCKS_PER_SM
#define CUPLUG_VECTOR_SUM_BLOCKS_PER_SM 3
#endif
constexpr int kEwVecs = CUPLUG_VECTOR_EW_VECS;

// 16 bytes of elements, as one vector load/store moves them.
template <class T>
union Vec {
  static constexpr int kCount = 16 / sizeof(T);
  uint4 u;
  uint32_t w[4];
  T e[kCount];
};

__device__ __forceinline__ bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

template <class T>
using Unsigned = typename std::make_unsigned<T>::type;

// ---- add ---------------------------------------------------------------------

__device__ __forceinline__ float add1(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add1(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ f16 add1(f16 a, f16 b) {
  f16 r;
  asm("add.rn.f16 %0, %1, %2;" : "=h"(r.bits) : "h"(a.bits), "h"(b.bits));  // correctly rounded = float32 then RNE
  return r;
}
__device__ __forceinline__ bf16 add1(bf16 a, bf16 b) { return f32_to_bf16(__fadd_rn(to_f32(a), to_f32(b))); }
template <class T, typename std::enable_if<std::is_integral<T>::value, int>::type = 0>
__device__ __forceinline__ T add1(T a, T b) {
  return (T)(Unsigned<T>)((Unsigned<T>)a + (Unsigned<T>)b);  // wraps, no signed overflow
}

template <class T>
struct Add {
  static constexpr int kArity = 2;
  __device__ __forceinline__ T operator()(T a, T b) const { return add1(a, b); }
  __device__ __forceinline__ void vec(const Vec<T>& a, const Vec<T>& b, Vec<T>& o) const {
    if constexpr (std::is_same<T, f16>::value) {
#pragma unroll
      for (int k = 0; k < 4; ++k) asm("add.rn.f16x2 %0, %1, %2;" : "=r"(o.w[k]) : "r"(a.w[k]), "r"(b.w[k]));
    } else if constexpr (std::is_same<T, bf16>::value) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float lo = __fadd_rn(bits_float(a.w[k] << 16), bits_float(b.w[k] << 16));
        const float hi = __fadd_rn(bits_float(a.w[k] & 0xffff0000u), bits_float(b.w[k] & 0xffff0000u));
        o.w[k] = f32x2_to_bf16x2(lo, hi);
      }
    } else {
#pragma unroll
      for (int i = 0; i < Vec<T>::kCount; ++i) o.e[i] = add1(a.e[i], b.e[i]);
    }
  }
};

// ---- scale_add -----------------------------------------------------------------

// The parameter type of x * alpha + beta for element type T: float for the
// 16- and 32-bit floats (PyTorch's opmath), double for float64, int64 for integers.
template <class T>
struct ScaleParam {
  using type = typename std::conditional<std::is_integral<T>::value, int64_t,
                                         typename std::conditional<std::is_same<T, double>::value, double,
                                                                   float>::type>::type;
};

__device__ __forceinline__ float scale_add1(float x, float a, float b) { return __fadd_rn(__fmul_rn(x, a), b); }
__device__ __forceinline__ double scale_add1(double x, double a, double b) { return __dadd_rn(__dmul_rn(x, a), b); }
__device__ __forceinline__ f16 scale_add1(f16 x, float a, float b) {
  const f16 t = f32_to_f16(__fmul_rn(to_f32(x), a));
  return f32_to_f16(__fadd_rn(to_f32(t), b));
}
__device__ __forceinline__ bf16 scale_add1(bf16 x, float a, float b) {
  const bf16 t = f32_to_bf16(__fmul_rn(to_f32(x), a));
  return f32_to_bf16(__fadd_rn(to_f32(t), b));
}
template <class T, typename std::enable_if<std::is_integral<T>::value, int>::type = 0>
__device__ __forceinline__ T scale_add1(T x, int64_t a, int64_t b) {
  // Modulo 2^64, then truncated to T: the same residue as PyTorch's wrapping T arithmetic.
  return (T)(uint64_t)((uint64_t)(int64_t)x * (uint64_t)a + (uint64_t)b);
}

template <class T>
struct ScaleAdd {
  static constexpr int kArity = 1;
  using P = typename ScaleParam<T>::type;
  P alpha, beta;
  __device__ __forceinline__ T operator()(T x, T) const { return scale_add1(x, alpha, beta); }
  __device__ __forceinline__ void vec(const Vec<T>& a, const Vec<T>&, Vec<T>& o) const {
#pragma unroll
    for (int i = 0; i < Vec<T>::kCount; ++i) o.e[i] = scale_add1(a.e[i], alpha, beta);
  }
};

// ---- the elementwise kernel ------------------------------------------------------
// vec: every pointer is 16-byte aligned; then kEwVecs 16-byte vectors per
// thread (a block covers kThreads * kEwVecs consecutive vectors, each load
// coalesced across the warp; the grid covers them all, grid-stride if it could
// not) and a scalar tail of fewer than 16 / sizeof(T) elements. Otherwise
// scalar, one element per thread.
template <class T, class Op>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ out, long long n, int vec,
                       Op op) {
  constexpr int kE = Vec<T>::kCount;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long done = 0;
  if (vec) {
    const long long nv = n / kE;
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    const uint4* y4 = reinterpret_cast<const uint4*>(y);
    uint4* o4 = reinterpret_cast<uint4*>(out);
#pragma unroll 1
    for (long long base = (long long)blockIdx.x * blockDim.x * kEwVecs; base < nv; base += stride * kEwVecs) {
      Vec<T> a[kEwVecs], b[kEwVecs];
#pragma unroll
      for (int k = 0; k < kEwVecs; ++k) {
        const long long i = base + k * kThreads + threadIdx.x;
        if (i < nv) {
          a[k].u = x4[i];
          if constexpr (Op::kArity == 2) b[k].u = y4[i];
        }
      }
#pragma unroll
      for (int k = 0; k < kEwVecs; ++k) {
        const long long i = base + k * kThreads + threadIdx.x;
        if (i < nv) {
          Vec<T> o;
          op.vec(a[k], b[k], o);
          o4[i] = o.u;
        }
      }
    }
    done = nv * kE;
  }
#pragma unroll 1
  for (long long i = done + t; i < n; i += stride) {
    if constexpr (Op::kArity == 2)
      out[i] = op(x[i], y[i]);
    else
      out[i] = op(x[i], x[i]);
  }
}

template <class T, class Op>
int launch_elementwise(const cuplug_call* c, Op op) {
  const long long n = c->n;
  if (n <= 0) return CUPLUG_OK;  // nothing to write; a grid of 0 blocks is a launch error
  const T* x = static_cast<const T*>(c->in[0].data);
  const T* y = Op::kArity == 2 ? static_cast<const T*>(c->in[1].data) : nullptr;
  T* out = static_cast<T*>(c->out[0].data);
  const int vec = ((uintptr_t)x | (uintptr_t)y | (uintptr_t)out) % 16 == 0;
  const long long vectors = (n + Vec<T>::kCount - 1) / Vec<T>::kCount;
  const long long items = vec ? (vectors + kEwVecs - 1) / kEwVecs : n;
  elementwise_kernel<T, Op><<<cuplug_cuda_full_grid(items, kThreads), kThreads, 0, (cudaStream_t)c->stream>>>(
      x, y, out, n, vec, op);
  return CUPLUG_OK;
}

// int8 runs on the uint8 kernels: add and x * alpha + beta modulo 2^8 give the
// same bits for signed and unsigned bytes (one kernel fewer per op to compile).
template <class T>
using Storage = typename std::conditional<std::is_same<T, int8_t>::value, uint8_t, T>::type;

int add(const cuplug_call* c) {
  return cuplug_dispatch(c->in[0].dtype, [&](auto tag) {
    using T = Storage<typename decltype(tag)::type>;
    return launch_elementwise<T>(c, Add<T>{});
  });
}

int scale_add(const cuplug_call* c) {
  const double alpha = cuplug_attr_float(c, "alpha"), beta = cuplug_attr_float(c, "beta");
  return cuplug_dispatch(c->in[0].dtype, [&](auto tag) {
    using T = Storage<typename decltype(tag)::type>;
    using P = typename ScaleParam<T>::type;
    if constexpr (std::is_integral<T>::value) {
      // int64 holds [-2^63, 2^63): both bounds are exact doubles.
      auto integral = [](double v) { return v == floor(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0; };
      if (!integral(alpha) || !integral(beta))
        return cuplug_op_fail(c,
                              "scale_add on %s needs integral alpha and beta (int64 range), got alpha=%.17g "
                              "beta=%.17g; cast x to a float dtype for a fractional scale",
                              cuplug_dtype_name(c->in[0].dtype), alpha, beta);
    }
    return launch_elementwise<T>(c, ScaleAdd<T>{(P)alpha, (P)beta});
  });
}

// ---- sum -------------------------------------------------------------------------

template <class T>
struct SumTraits {  // integers: int64 accumulator with wraparound, in uint64 arithmetic
  using Acc = unsigned long long;
  using Out = int64_t;
  static __device__ __forceinline__ Acc acc(T v) { return (Acc)(long long)v; }
  static __device__ __forceinline__ Out out(Acc a) { return (Out)a; }
};
template <>
struct SumTraits<float> {
  using Acc = double;
  using Out = float;
  static __device__ __forceinline__ Acc acc(float v) { return (double)v; }
  static __device__ __forceinline__ Out out(Acc a) { return __double2float_rn(a); }
};
template <>
struct SumTraits<double> {
  using Acc = double;
  using Out = double;
  static __device__ __forceinline__ Acc acc(double v) { return v; }
  static __device__ __forceinline__ Out out(Acc a) { return a; }
};
template <>
struct SumTraits<f16> {
  using Acc = float;
  using Out = f16;
  static __device__ __forceinline__ Acc acc(f16 v) { return to_f32(v); }
  static __device__ __forceinline__ Out out(Acc a) { return f32_to_f16(a); }
};
template <>
struct SumTraits<bf16> {
  using Acc = float;
  using Out = bf16;
  static __device__ __forceinline__ Acc acc(bf16 v) { return to_f32(v); }
  static __device__ __forceinline__ Out out(Acc a) { return f32_to_bf16(a); }
};

// Plain adds (never contracted: there is no multiply), in a fixed order.
template <class A>
__device__ __forceinline__ A acc_add(A a, A b) {
  return a + b;
}
__device__ __forceinline__ float acc_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double acc_add(double a, double b) { return __dadd_rn(a, b); }

// A fixed tree over the block: shuffles within each warp, then warp 0 over the
// warps' sums. The result is valid in thread 0.
template <class A>
__device__ __forceinline__ A block_reduce(A v, A* warp_sums) {
  constexpr int kWarps = kThreads / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = acc_add(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? warp_sums[lane] : A(0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = acc_add(v, __shfl_down_sync(0xffffffffu, v, o));
  }
  return v;
}

constexpr int kSumUnroll = CUPLUG_VECTOR_SUM_UNROLL;            // 16-byte vectors in flight per thread
constexpr int kSumBlocksPerSm = CUPLUG_VECTOR_SUM_BLOCKS_PER_SM;  // resident blocks per SM (launch bounds)
constexpr size_t kSumTicketBytes = 256;  // scratch: ticket counter | partials[gridDim.x]

// Adds one vector's elements to acc. Floats: in element order (the order is
// part of the result). Integers: modulo 2^64, where any order gives the same
// bits, so bytes go four at a time through dp4a (16 of them fit an int32).
template <class T, class A>
__device__ __forceinline__ A fold_vector(const Vec<T>& r, A acc) {
  if constexpr (std::is_same<T, int8_t>::value || std::is_same<T, uint8_t>::value) {
    if constexpr (std::is_same<T, int8_t>::value) {
      int s = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) s = __dp4a((int)r.w[k], 0x01010101, s);
      return acc + (A)(long long)s;
    } else {
      unsigned s = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) s = __dp4a(r.w[k], 0x01010101u, s);
      return acc + (A)s;
    }
  } else {
#pragma unroll
    for (int e = 0; e < Vec<T>::kCount; ++e) acc = acc_add(acc, SumTraits<T>::acc(r.e[e]));
    return acc;
  }
}

// The same elements, read one by one from an address of any alignment: the same
// additions in the same order for floats, so the bits do not depend on alignment.
template <class T, class A>
__device__ __forceinline__ A fold_elements(const T* __restrict__ p, A acc) {
#pragma unroll 1
  for (int e = 0; e < Vec<T>::kCount; ++e) acc = acc_add(acc, SumTraits<T>::acc(p[e]));
  return acc;
}

// One pass: each block folds its elements into a partial; the last block to
// finish (ticket counter) folds the partials in index order and writes out[0].
// Vector v (16 bytes of elements) always lands in the same thread's same
// accumulator for a given grid: thread t takes v = t + (i * kSumUnroll + u) *
// nthreads into acc[u]. Unaligned x is read element by element in the same
// pattern, so the bits depend on n and the grid only (not on alignment or run).
template <class T>
__global__ void __launch_bounds__(kThreads, kSumBlocksPerSm)
    sum_kernel(const T* __restrict__ x, long long n, int vec, unsigned* ticket,
               typename SumTraits<T>::Acc* partials, typename SumTraits<T>::Out* out) {
  using Tr = SumTraits<T>;
  using A = typename Tr::Acc;
  constexpr int kE = Vec<T>::kCount;
  __shared__ A warp_sums[kThreads / 32];
  __shared__ bool last;
  const long long nthreads = (long long)gridDim.x * blockDim.x;
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long nv = n / kE;  // whole vectors
  A acc[kSumUnroll];
#pragma unroll
  for (int u = 0; u < kSumUnroll; ++u) acc[u] = A(0);
  long long v = t;
  if (vec) {  // main loop: kSumUnroll 16-byte loads in flight, then their folds
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
#pragma unroll 1
    for (; v + (kSumUnroll - 1) * nthreads < nv; v += kSumUnroll * nthreads) {
      Vec<T> r[kSumUnroll];
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) r[u].u = x4[v + u * nthreads];
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) acc[u] = fold_vector(r[u], acc[u]);
    }
  } else {
#pragma unroll 1
    for (; v + (kSumUnroll - 1) * nthreads < nv; v += kSumUnroll * nthreads)
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) acc[u] = fold_elements(x + (v + u * nthreads) * kE, acc[u]);
  }
  // The last partial round of vectors (16-byte loads where x is aligned: the same
  // additions in the same order as element by element), then the scalar tail (< kE
  // elements).
  if (vec) {
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    Vec<T> r[kSumUnroll];
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u)
      if (v + u * nthreads < nv) r[u].u = x4[v + u * nthreads];
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u)
      if (v + u * nthreads < nv) acc[u] = fold_vector(r[u], acc[u]);
  } else {
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u)
      if (v + u * nthreads < nv) acc[u] = fold_elements(x + (v + u * nthreads) * kE, acc[u]);
  }
  if (t < n - nv * kE) acc[0] = acc_add(acc[0], Tr::acc(x[nv * kE + t]));
  A mine = acc[0];
#pragma unroll
  for (int u = 1; u < kSumUnroll; ++u) mine = acc_add(mine, acc[u]);

  A block = block_reduce(mine, warp_sums);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = block;
    __threadfence();  // the partial is visible device-wide before the ticket counts it
    last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  A fold = A(0);
  for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x) fold = acc_add(fold, __ldcg(&partials[i]));
  __syncthreads();  // warp_sums is reused
  fold = block_reduce(fold, warp_sums);
  if (threadIdx.x == 0) {
    out[0] = Tr::out(fold);
    *ticket = 0;  // ready for the next launch (scratch is handed out zeroed)
  }
}

int sum(const cuplug_call* c) {
  return cuplug_dispatch(c->in[0].dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Tr = SumTraits<T>;
    const T* x = static_cast<const T*>(c->in[0].data);
    const long long n = c->n;
    const long long vectors = n / Vec<T>::kCount;
    const long long want = (vectors + (long long)kThreads * kSumUnroll - 1) / ((long long)kThreads * kSumUnroll);
    const long long cap = (long long)c->sm_count * kSumBlocksPerSm;
    const int blocks = (int)(want < 1 ? 1 : (want > cap ? cap : want));
    char* scratch = static_cast<char*>(cuplug_cuda_scratch(c, kSumTicketBytes + sizeof(typename Tr::Acc) * blocks));
    if (scratch == nullptr) return CUPLUG_E_OUT_OF_MEMORY;
    sum_kernel<T><<<blocks, kThreads, 0, (cudaStream_t)c->stream>>>(
        x, n, ((uintptr_t)x % 16) == 0, reinterpret_cast<unsigned*>(scratch),
        reinterpret_cast<typename Tr::Acc*>(scratch + kSumTicketBytes), static_cast<typename Tr::Out*>(c->out[0].data));
    return CUPLUG_OK;
  });
}

}  // namespace vector_kernels

// The same signatures as the CPU twin (backends/cpu/vector_cpu.c).
static const cuplug_op cuplug_ops[] = {
    {"add", vector_kernels::add, CUPLUG_ELEMENTWISE,
     {CUPLUG_IN("x", CUPLUG_NUMERIC), CUPLUG_IN_LIKE("y", 0)},
     {CUPLUG_OUT_LIKE("out", 0)},
     {{0}},
     {{0}},
     0},
    {"scale_add", vector_kernels::scale_add, CUPLUG_ELEMENTWISE,
     {CUPLUG_IN("x", CUPLUG_NUMERIC)},
     {CUPLUG_OUT_LIKE("out", 0)},
     {CUPLUG_ATTR_FLOAT("alpha", 1.0), CUPLUG_ATTR_FLOAT("beta", 0.0)},
     {{0}},
     0},
    {"sum", vector_kernels::sum, 0,
     {CUPLUG_IN("x", CUPLUG_NUMERIC)},
     {CUPLUG_OUT("out", CUPLUG_DT_ACCUM, 0, CUPLUG_SHAPE_SCALAR, 0, NULL)},
     {{0}},
     {{0}},
     0},
};

#include "cuplug_cuda_backend.cuh"
