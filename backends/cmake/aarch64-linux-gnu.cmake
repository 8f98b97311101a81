# CMake toolchain file: build cuplug backends (CPU twin and CUDA variants) for
# aarch64 Linux on an x86_64 machine.
#
#   cmake -DCMAKE_TOOLCHAIN_FILE=<this file> -DCUPLUG_CROSS_PREFIX=<dir>/aarch64-linux-gnu- ...
#
# CUPLUG_CROSS_PREFIX is the cross tools' path prefix (append gcc, g++): the one
# `cuplug.kit.toolchain.install_cross_compiler()` unpacked into the cache, or,
# when unset, `aarch64-linux-gnu-` from PATH (Debian's crossbuild-essential-arm64).
# Host code is compiled by the cross g++; device code by the x86_64 nvcc given as
# CMAKE_CUDA_COMPILER (an overlay whose nvcc.profile names targets/sbsa-linux),
# with the cross g++ as its host compiler. Link against an aarch64 glibc sysroot
# with CUPLUG_SYSROOT, as on x86_64.

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT DEFINED CUPLUG_CROSS_PREFIX AND DEFINED ENV{CUPLUG_CROSS_PREFIX})
  set(CUPLUG_CROSS_PREFIX "$ENV{CUPLUG_CROSS_PREFIX}")
endif()
if(NOT DEFINED CUPLUG_CROSS_PREFIX)
  set(CUPLUG_CROSS_PREFIX "aarch64-linux-gnu-")
endif()
set(CUPLUG_CROSS_PREFIX "${CUPLUG_CROSS_PREFIX}" CACHE STRING "aarch64 cross tools' path prefix")
# try_compile projects read this file again: hand them the same prefix.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES CUPLUG_CROSS_PREFIX)

set(CMAKE_C_COMPILER "${CUPLUG_CROSS_PREFIX}gcc")
set(CMAKE_CXX_COMPILER "${CUPLUG_CROSS_PREFIX}g++")
set(CMAKE_CUDA_HOST_COMPILER "${CUPLUG_CROSS_PREFIX}g++")
set(CMAKE_AR "${CUPLUG_CROSS_PREFIX}ar" CACHE FILEPATH "")
set(CMAKE_RANLIB "${CUPLUG_CROSS_PREFIX}ranlib" CACHE FILEPATH "")
set(CMAKE_STRIP "${CUPLUG_CROSS_PREFIX}strip" CACHE FILEPATH "")

# Programs (nvcc, ninja) run here; libraries and headers come from the target only.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
