// The CUDA side of the `scan` backend: an inclusive prefix sum. The op table and its
// launch functions; the kernels are in scan_kernels.cu (a second translation unit,
// reached through scan_kernels.h on INCLUDE_DIRS). cuplug's cuplug_cuda_backend.cuh
// supplies the whole C ABI around the table.
#include <cuda_runtime.h>

#include "cuplug_ops.h"
#include "scan_kernels.h"

namespace scan_kernels {

int prefix_sum(const cuplug_call* c) {
  float* scratch = static_cast<float*>(cuplug_cuda_scratch(c, sizeof(float) * (size_t)scratch_floats(c->n)));
  if (scratch == nullptr) return CUPLUG_E_OUT_OF_MEMORY;
  scan(c->x, c->out, c->n, scratch, (cudaStream_t)c->stream);
  return CUPLUG_OK;
}

}  // namespace scan_kernels

static const cuplug_op cuplug_ops[] = {
    {"prefix_sum", 1, CUPLUG_OUT_N, 0, scan_kernels::prefix_sum},
};

#include "cuplug_cuda_backend.cuh"
