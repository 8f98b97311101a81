/* The C floor of one 1-element add through the CPU twin's cuplug_backend_call (no Python): what any binding pays. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include "cuplug/backend.h"
int main(int argc, char** argv) {
  void* so = dlopen(argv[1], RTLD_NOW);
  if (!so) { printf("%s\n", dlerror()); return 1; }
  cuplug_backend* (*create)(const char*) = dlsym(so, "cuplug_backend_create");
  int (*call)(cuplug_backend*, const char*, const cuplug_tensor*, int, cuplug_tensor*, int, const cuplug_attr*, int, uint64_t) = dlsym(so, "cuplug_backend_call");
  cuplug_backend* h = create(NULL);
  float x = 1, y = 2, o = 0; int64_t shape[1] = {1};
  cuplug_tensor in[2] = {{&x, 1, 0, 1, {2, 32, 1}, shape, NULL, 0}, {&y, 1, 0, 1, {2, 32, 1}, shape, NULL, 0}};
  cuplug_tensor out[1] = {{&o, 1, 0, 1, {2, 32, 1}, shape, NULL, 0}};
  for (int rep = 0; rep < 5; ++rep) {
    struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
    int n = 200000;
    for (int i = 0; i < n; ++i) call(h, "add", in, 2, out, 1, NULL, 0, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f us per call (o=%g)\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n / 1000.0, o);
  }
  return 0;
}
