// What scan.cu (the op table) calls in scan_kernels.cu (the kernels): found through
// INCLUDE_DIRS in cuda/CMakeLists.txt. Each .cu is its own translation unit with its
// own fat binary; host functions connect them (no device code crosses files).
#ifndef SCAN_KERNELS_H
#define SCAN_KERNELS_H

#include <cuda_runtime.h>

namespace scan_kernels {

// Floats of scratch memory scan() needs for n elements (the tile sums of every level).
long long scratch_floats(long long n);

// Inclusive prefix sum of x[0..n) into out (in place is fine), on `stream`.
void scan(const float* x, float* out, long long n, float* scratch, cudaStream_t stream);

}  // namespace scan_kernels

#endif
