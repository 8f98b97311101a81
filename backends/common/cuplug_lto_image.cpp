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
// registered as it is; the ping reports "lto_linked": null, and the loader refuses such a load. The loader hands
// the image as a sealed in-memory file (/proc/self/fd/N): the bytes it checked are the bytes registered here.

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
constexpr unsigned short kElfEntry = 2;
constexpr int kDeviceLinked = 2;  // FATBINC_LINK_VERSION: the wrapper of a device link's image (the one to swap)
constexpr long kMaxImageBytes = 1L << 30;

// The arch of a container that is whole and holds exactly one uncompressed cubin (contract/fatbin.py's layout:
// what the loader writes), or 0 for anything else: a torn or foreign file never reaches the runtime.
int image_arch(const unsigned char* p, long n) {
  unsigned magic = 0, entry_header = 0, arch = 0, compressed = 0;
  unsigned short header = 0, kind = 0;
  unsigned long long size = 0, payload = 0;
  if (n < 16 + 64) return 0;
  memcpy(&magic, p, 4);
  memcpy(&header, p + 6, 2);
  memcpy(&size, p + 8, 8);
  if (magic != kContainerMagic || header != 16 || size != (unsigned long long)(n - 16)) return 0;
  const unsigned char* e = p + 16;
  memcpy(&kind, e, 2);
  memcpy(&entry_header, e + 4, 4);
  memcpy(&payload, e + 8, 8);
  memcpy(&compressed, e + 16, 4);
  memcpy(&arch, e + 28, 4);
  if (kind != kElfEntry || compressed != 0 || entry_header < 64 || payload > size || entry_header + payload != size)
    return 0;
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
  const FatbinWrapper* built = static_cast<const FatbinWrapper*>(wrapper);
  // Only the device link's registration (version 2) is swapped: a linked static library's own whole-program
  // image (version 1) registers as it is, whichever constructor runs first.
  if (path != nullptr && *path != '\0' && cuplug_lto_linked_arch == 0 && built->version == kDeviceLinked) {
    long size = 0;
    unsigned char* image = read_image(path, &size);
    const int arch = image != nullptr ? image_arch(image, size) : 0;
    if (arch > 0) {
      // Version 1: a plain fat binary (the built one is version 2, a device link's, with its prelinked list).
      g_linked = FatbinWrapper{built->magic, 1, image, nullptr};
      cuplug_lto_linked_arch = arch;
      return __real___cudaRegisterFatBinary(&g_linked);
    }
    free(image);
  }
  return __real___cudaRegisterFatBinary(wrapper);
}
