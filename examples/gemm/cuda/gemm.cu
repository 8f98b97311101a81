// The CUDA side of the `gemm` backend: C = A B of two row-major side x side float32 matrices, by
// cublasSgemm (the toolchain component `cublas`, declared in ../pyproject.toml). cuBLAS is column-major:
// a row-major matrix is its transpose, so C^T = B^T A^T is one column-major GEMM with A and B swapped.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuplug_ops.h"

namespace gemm_ops {

int gemm(const cuplug_call* c) {
  const long long side = cuplug_attr_int(c, "side");
  if (side <= 0 || side > (1 << 15) || side * side != c->n)
    return cuplug_op_fail(c, "gemm: a and b must hold side*side elements (side=%lld), got %lld", side, c->n);
  cublasHandle_t handle;
  cublasStatus_t st = cublasCreate(&handle);
  if (st != CUBLAS_STATUS_SUCCESS) return cuplug_op_fail(c, "gemm: cublasCreate failed (%d)", (int)st);
  const int n = (int)side;
  const float one = 1.0f, zero = 0.0f;
  st = cublasSetStream(handle, (cudaStream_t)c->stream);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, static_cast<const float*>(c->in[1].data), n,
                     static_cast<const float*>(c->in[0].data), n, &zero, static_cast<float*>(c->out[0].data), n);
  cublasDestroy(handle);
  if (st != CUBLAS_STATUS_SUCCESS) return cuplug_op_fail(c, "gemm: cublasSgemm failed (%d)", (int)st);
  return CUPLUG_OK;
}

}  // namespace gemm_ops

static const cuplug_op cuplug_ops[] = {
    {"gemm", gemm_ops::gemm, 0,
     {CUPLUG_IN("a", CUPLUG_F32), CUPLUG_IN_LIKE("b", 0)},
     {CUPLUG_OUT_LIKE("c", 0)},
     {CUPLUG_ATTR_INT("side", 64)},
     {CUPLUG_SIZE(0, 0, 1, 0)},
     64 * 64},
};

#include "cuplug_cuda_backend.cuh"
