// The CUDA side of the `scan` backend: an inclusive prefix sum. Kernels and an op
// table; cuplug's cuplug_cuda_backend.cuh supplies the whole C ABI around them.
#include <cuda_runtime.h>

#include "cuplug_ops.h"

namespace scan_kernels {  // named: cudafe++ gives anonymous namespaces a random id

constexpr int kThreads = 256;
constexpr int kItems = 8;  // per thread
constexpr long long kTile = kThreads * kItems;

// Scans one tile per block (in place is fine: each thread reads its items before
// any write); writes the tile's total to tile_sums[block] when asked.
__global__ void scan_tiles(const float* x, float* out, float* tile_sums, long long n) {
  __shared__ float totals[kThreads];
  const long long base = (long long)blockIdx.x * kTile + (long long)threadIdx.x * kItems;
  float items[kItems];
  float running = 0.0f;
  for (int k = 0; k < kItems; ++k) {
    running += base + k < n ? x[base + k] : 0.0f;
    items[k] = running;
  }
  totals[threadIdx.x] = running;
  __syncthreads();
  for (int offset = 1; offset < kThreads; offset <<= 1) {  // Hillis-Steele over the thread totals
    float left = threadIdx.x >= offset ? totals[threadIdx.x - offset] : 0.0f;
    __syncthreads();
    totals[threadIdx.x] += left;
    __syncthreads();
  }
  const float before = threadIdx.x ? totals[threadIdx.x - 1] : 0.0f;
  for (int k = 0; k < kItems; ++k)
    if (base + k < n) out[base + k] = items[k] + before;
  if (tile_sums != nullptr && threadIdx.x == kThreads - 1) tile_sums[blockIdx.x] = totals[kThreads - 1];
}

// Tile t > 0 adds the scanned total of the tiles before it.
__global__ void add_tile_offsets(float* out, const float* scanned_tile_sums, long long n) {
  const long long tile = blockIdx.x + 1;
  const float offset = scanned_tile_sums[tile - 1];
  for (long long i = tile * kTile + threadIdx.x; i < n && i < (tile + 1) * kTile; i += kThreads) out[i] += offset;
}

long long tiles_of(long long n) { return (n + kTile - 1) / kTile; }

// Scans x into out; `scratch` holds the tile sums of this level and every level below.
void scan(const float* x, float* out, long long n, float* scratch, cudaStream_t stream) {
  const long long tiles = tiles_of(n);
  if (tiles == 1) {
    scan_tiles<<<1, kThreads, 0, stream>>>(x, out, nullptr, n);
    return;
  }
  scan_tiles<<<(unsigned)tiles, kThreads, 0, stream>>>(x, out, scratch, n);
  scan(scratch, scratch, tiles, scratch + tiles, stream);
  add_tile_offsets<<<(unsigned)(tiles - 1), kThreads, 0, stream>>>(out, scratch, n);
}

int prefix_sum(const cuplug_call* c) {
  long long need = 0;
  for (long long level = tiles_of(c->n); level > 1; level = tiles_of(level)) need += level;
  float* scratch = static_cast<float*>(cuplug_cuda_scratch(c, sizeof(float) * (size_t)(need + 1)));
  if (scratch == nullptr) return CUPLUG_E_OUT_OF_MEMORY;
  scan(c->x, c->out, c->n, scratch, (cudaStream_t)c->stream);
  return CUPLUG_OK;
}

}  // namespace scan_kernels

static const cuplug_op cuplug_ops[] = {
    {"prefix_sum", 1, CUPLUG_OUT_N, 0, scan_kernels::prefix_sum},
};

#include "cuplug_cuda_backend.cuh"
