// The kernels of the `scan` backend and their host-side launcher (see scan_kernels.h).
#include "scan_kernels.h"

// Items per thread: a build option, from COMPILE_DEFINITIONS in cuda/CMakeLists.txt.
#ifndef SCAN_ITEMS_PER_THREAD
#error "SCAN_ITEMS_PER_THREAD comes from cuplug_add_cuda_backend(... COMPILE_DEFINITIONS ...)"
#endif

namespace scan_kernels {  // named: cudafe++ gives anonymous namespaces a random id

constexpr int kThreads = 256;
constexpr int kItems = SCAN_ITEMS_PER_THREAD;
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

static long long tiles_of(long long n) { return (n + kTile - 1) / kTile; }

long long scratch_floats(long long n) {
  long long need = 0;
  for (long long level = tiles_of(n); level > 1; level = tiles_of(level)) need += level;
  return need + 1;
}

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

}  // namespace scan_kernels
