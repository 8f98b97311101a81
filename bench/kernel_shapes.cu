// Which shape of the elementwise add reaches the H200's memory ceiling?
// A one-off study for issue 8, compiled and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o /tmp/shapes bench/kernel_shapes.cu && /tmp/shapes
// Prints GB/s (bytes read + written, median of 9) of each add shape on 1 GiB
// arrays and of cudaMemcpy device-to-device on the same arrays.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e = (x);                                                                \
    if (e != cudaSuccess) {                                                             \
      printf("%s: %s\n", #x, cudaGetErrorString(e));                                    \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

enum Hint { kPlain, kStreaming };

template <int kUnroll, Hint kHint>
__global__ void add(const float4* __restrict__ x, const float4* __restrict__ y,
                    float4* __restrict__ out, long long n4) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n4; i += kUnroll * stride) {
    float4 a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (kHint == kStreaming) {
        a[u] = __ldcs(x + i + u * stride);
        b[u] = __ldcs(y + i + u * stride);
      } else {
        a[u] = x[i + u * stride];
        b[u] = y[i + u * stride];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float4 r = make_float4(a[u].x + b[u].x, a[u].y + b[u].y, a[u].z + b[u].z, a[u].w + b[u].w);
      if (kHint == kStreaming) __stcs(out + i + u * stride, r); else out[i + u * stride] = r;
    }
  }
  for (; i < n4; i += stride) {
    float4 a = x[i], b = y[i];
    out[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
}

template <typename Launch>
float median_ms(Launch launch) {
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  launch();
  cudaDeviceSynchronize();
  std::vector<float> ms;
  for (int r = 0; r < 9; ++r) {
    cudaEventRecord(t0);
    launch();
    cudaEventRecord(t1);
    cudaEventSynchronize(t1);
    float v = 0;
    cudaEventElapsedTime(&v, t0, t1);
    ms.push_back(v);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main() {
  const long long n = 1LL << 28, n4 = n / 4;
  const size_t bytes = n * sizeof(float);
  float *x, *y, *out;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemset(x, 0, bytes));
  CHECK(cudaMemset(y, 0, bytes));
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto gbs = [](double moved, float ms) { return moved / ms / 1e6; };
  printf("{\n  \"sms\": %d,\n", sms);
  printf("  \"d2d_copy_GBs\": %.0f,\n", gbs(2.0 * bytes, median_ms([&] { cudaMemcpyAsync(out, x, bytes, cudaMemcpyDeviceToDevice); })));
  const float4 *x4 = (const float4*)x, *y4 = (const float4*)y;
  float4* o4 = (float4*)out;
  struct Shape { const char* name; int threads; long long blocks; void (*k)(const float4*, const float4*, float4*, long long); };
  const long long full = (n4 + 255) / 256;
  Shape shapes[] = {
      {"cap16_u1_t256 (shipped)", 256, sms * 16LL, add<1, kPlain>},
      {"cap8_u1_t256", 256, sms * 8LL, add<1, kPlain>},
      {"cap32_u1_t256", 256, sms * 32LL, add<1, kPlain>},
      {"full_u1_t256", 256, full, add<1, kPlain>},
      {"cap16_u2_t256", 256, sms * 16LL, add<2, kPlain>},
      {"cap16_u4_t256", 256, sms * 16LL, add<4, kPlain>},
      {"cap8_u4_t256", 256, sms * 8LL, add<4, kPlain>},
      {"cap4_u4_t512", 512, sms * 4LL, add<4, kPlain>},
      {"cap16_u1_t256_cs", 256, sms * 16LL, add<1, kStreaming>},
      {"cap16_u2_t256_cs", 256, sms * 16LL, add<2, kStreaming>},
      {"cap8_u4_t256_cs", 256, sms * 8LL, add<4, kStreaming>},
      {"full_u1_t256_cs", 256, full, add<1, kStreaming>},
  };
  for (const Shape& s : shapes) {
    float ms = median_ms([&] { s.k<<<(unsigned)s.blocks, s.threads>>>(x4, y4, o4, n4); });
    CHECK(cudaGetLastError());
    printf("  \"%s\": %.0f,\n", s.name, gbs(3.0 * bytes, ms));
  }
  printf("  \"done\": 1\n}\n");
  return 0;
}
