// Development shim: the CUDA kernels of cuda/quant.cu without cuplug's framework,
// behind the same quant_shim_call() as dev/cpu_shim.c (host buffers in, host
// buffers out, through device copies), so dev/check.py checks them unchanged:
//   nvcc -O3 -arch=sm_90 -shared -Xcompiler=-fPIC -I<cuplug>/backends/include
//        -I<cuplug>/backends/common -o libquant_cuda_shim.so dev/cuda_shim.cu
// QUANT_SHIM_OFFSET=k shifts every device operand by k elements (k=1: the
// unaligned kernels).
#include <algorithm>
#include <cstdlib>

#define CUPLUG_CUDA_BACKEND_CUH  // the framework stays out
#include "../cuda/quant.cu"

static void* dev_copy(const void* host, size_t bytes, size_t pad, void** base) {
  cudaMalloc(base, bytes + pad + 16);
  char* p = static_cast<char*>(*base) + pad;
  if (host != nullptr && bytes > 0) cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
  return p;
}

extern "C" __attribute__((visibility("default"))) int quant_shim_call(int op, void* in0, int code, int bits,
                                                                      long long n, void* in1, long long n1,
                                                                      void* out0, void* out1, long long blocksize,
                                                                      char* err, int err_len) {
  const char* env = getenv("QUANT_SHIM_OFFSET");
  const size_t k = env ? strtoul(env, nullptr, 10) : 0;
  const size_t in0_size = bits / 8, nb = blocksize > 0 ? (size_t)((n + blocksize - 1) / blocksize) : 1;
  void *b0, *b1, *b2, *b3;
  int64_t shape0[1] = {n}, shape1[1] = {n1}, shape_nb[1] = {(int64_t)nb};
  cuplug_tensor in[2] = {
      {dev_copy(in0, n * in0_size, k * in0_size, &b0), CUPLUG_DEVICE_CUDA, 0, 1, {(uint8_t)code, (uint8_t)bits, 1},
       shape0, nullptr, 0},
      {dev_copy(in1, n1 * 4, k * 4, &b1), CUPLUG_DEVICE_CUDA, 0, 1, {CUPLUG_DTYPE_FLOAT, 32, 1}, shape1, nullptr, 0}};
  const size_t out0_size = op == 0 ? 1 : 4;
  cuplug_tensor out[2] = {
      {dev_copy(nullptr, n * out0_size, k * out0_size, &b2), CUPLUG_DEVICE_CUDA, 0, 1, {0, 8, 1}, shape0, nullptr, 0},
      {dev_copy(nullptr, nb * 4, k * 4, &b3), CUPLUG_DEVICE_CUDA, 0, 1, {CUPLUG_DTYPE_FLOAT, 32, 1}, shape_nb, nullptr,
       0}};
  cuplug_attr attr = {"blocksize", CUPLUG_ATTR_INT64, {blocksize}};
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cuplug_call c = {&cuplug_ops[op], in, op == 0 ? 1 : 2, out, op == 0 ? 2 : 1, &attr, 1, n, nullptr, sms,
                   nullptr, err, (size_t)err_len};
  err[0] = '\0';
  int rc = cuplug_ops[op].fn(&c);
  if (cudaDeviceSynchronize() != cudaSuccess && rc == 0) rc = CUPLUG_E_DEVICE;
  if (rc == 0) {
    cudaMemcpy(out0, out[0].data, n * out0_size, cudaMemcpyDeviceToHost);
    if (op == 0 && nb > 0 && n > 0) cudaMemcpy(out1, out[1].data, nb * 4, cudaMemcpyDeviceToHost);
  }
  cudaFree(b0), cudaFree(b1), cudaFree(b2), cudaFree(b3);
  return rc;
}

// Median milliseconds of `iters` launches of op 0/1 on n device elements (input
// dtype (code, bits) for op 0), timed with events; inputs are zero-filled.
extern "C" __attribute__((visibility("default"))) double quant_shim_bench(int op, int code, int bits, long long n,
                                                                         long long blocksize, int iters) {
  const long long nb = (n + blocksize - 1) / blocksize;
  void *x, *a, *y, *b;
  cudaMalloc(&x, n * (op == 0 ? bits / 8 : 1));
  cudaMalloc(&a, nb * 4);
  cudaMalloc(&y, n * (op == 0 ? 1 : 4));
  cudaMalloc(&b, nb * 4);
  cudaMemset(x, 0x3c, n * (op == 0 ? bits / 8 : 1));
  cudaMemset(a, 0x3f, nb * 4);
  int64_t shape0[1] = {n}, shape1[1] = {nb};
  cuplug_tensor in[2] = {{x, CUPLUG_DEVICE_CUDA, 0, 1, {(uint8_t)(op == 0 ? code : 0), (uint8_t)(op == 0 ? bits : 8), 1},
                          shape0, nullptr, 0},
                         {a, CUPLUG_DEVICE_CUDA, 0, 1, {CUPLUG_DTYPE_FLOAT, 32, 1}, shape1, nullptr, 0}};
  cuplug_tensor out[2] = {{y, CUPLUG_DEVICE_CUDA, 0, 1, {0, 8, 1}, shape0, nullptr, 0},
                          {b, CUPLUG_DEVICE_CUDA, 0, 1, {CUPLUG_DTYPE_FLOAT, 32, 1}, shape1, nullptr, 0}};
  cuplug_attr attr = {"blocksize", CUPLUG_ATTR_INT64, {blocksize}};
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  char err[256];
  cuplug_call c = {&cuplug_ops[op], in, op == 0 ? 1 : 2, out, op == 0 ? 2 : 1, &attr, 1, n, nullptr, sms,
                   nullptr, err, sizeof err};
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  float times[1000];
  iters = iters > 1000 ? 1000 : iters;
  for (int i = 0; i < 3; ++i) cuplug_ops[op].fn(&c);
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(e0);
    cuplug_ops[op].fn(&c);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&times[i], e0, e1);
  }
  std::sort(times, times + iters);
  cudaFree(x), cudaFree(a), cudaFree(y), cudaFree(b);
  return times[iters / 2];
}
