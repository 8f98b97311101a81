// The LTO-IR variant's image swap (docs/lto.md). Compiled into LTO variants only (cuplug.cmake adds it and links
// with --wrap=__cudaRegisterFatBinary).
//
// An LTO variant is built relocatable: each .cu holds LTO-IR (lto_XX) beside SASS of the oldest target, and the
// build's device link registers that SASS as the library's one fat binary. At load, cuplug links the LTO-IR for
// the exact GPU with nvJitLink, wraps the cubin in a fat binary container, and names the file in
// CUPLUG_LTO_IMAGE around dlopen(). The CUDA runtime registers a library's fat binary from a constructor, before
// any function of it can be called, so the swap happens here: the wrapped registration reads that file and hands
// its bytes to the runtime instead of the built image. The kernels' host stubs then register by name against the
// linked image, and every <<<>>> launch of the backend's source runs the code linked for this GPU, unmodified.
//
// Without CUPLUG_LTO_IMAGE (the library dlopened by something other than cuplug's loader) the built image is
// registered as it is; the ping reports "lto_linked": null, and the loader refuses such a load.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

// fatbinary_section.h's __fatBinC_Wrapper_t: what nvcc's registration code passes.
struct FatbinWrapper {
  int magic;
  int version;
  const void* data;
  void* filename_or_fatbins;
};

constexpr unsigned kContainerMagic = 0xBA55ED50u;
constexpr long kMaxImageBytes = 1L << 30;

// The container's first entry's arch (contract/fatbin.py's layout), or 0 when the bytes are no container.
int image_arch(const unsigned char* p, long n) {
  unsigned magic = 0, arch = 0;
  unsigned short header = 0;
  if (n < 16 + 32) return 0;
  memcpy(&magic, p, 4);
  memcpy(&header, p + 6, 2);
  if (magic != kContainerMagic || header < 16 || header + 32 > n) return 0;
  memcpy(&arch, p + header + 28, 4);
  return (int)arch;
}

// The whole file, or nullptr (never freed: the runtime reads the image until the process ends).
unsigned char* read_image(const char* path, long* size) {
  FILE* f = fopen(path, "rb");
  if (f == nullptr) return nullptr;
  unsigned char* buf = nullptr;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  if (n > 0 && n <= kMaxImageBytes && fseek(f, 0, SEEK_SET) == 0) {
    buf = static_cast<unsigned char*>(malloc((size_t)n));
    if (buf != nullptr && fread(buf, 1, (size_t)n, f) != (size_t)n) {
      free(buf);
      buf = nullptr;
    }
  }
  fclose(f);
  *size = n;
  return buf;
}

FatbinWrapper g_linked;

}  // namespace

// The SM number of the image this library registered from CUPLUG_LTO_IMAGE (90: sm_90); 0: the built one.
extern "C" __attribute__((visibility("hidden"))) int cuplug_lto_linked_arch = 0;

extern "C" void** __real___cudaRegisterFatBinary(void* wrapper);

extern "C" __attribute__((visibility("hidden"))) void** __wrap___cudaRegisterFatBinary(void* wrapper) {
  const char* path = getenv("CUPLUG_LTO_IMAGE");
  if (path != nullptr && *path != '\0' && cuplug_lto_linked_arch == 0) {
    long size = 0;
    unsigned char* image = read_image(path, &size);
    const int arch = image != nullptr ? image_arch(image, size) : 0;
    if (arch > 0) {
      const FatbinWrapper* built = static_cast<const FatbinWrapper*>(wrapper);
      // Version 1: a plain fat binary (the built one is version 2, a device link's, with its prelinked list).
      g_linked = FatbinWrapper{built->magic, 1, image, nullptr};
      cuplug_lto_linked_arch = arch;
      return __real___cudaRegisterFatBinary(&g_linked);
    }
    free(image);
  }
  return __real___cudaRegisterFatBinary(wrapper);
}
