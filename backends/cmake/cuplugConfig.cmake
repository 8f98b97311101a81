# find_package(cuplug CONFIG) entry point. Point CMake at it with
#   -Dcuplug_DIR="$(cuplug --cmake-dir)"
# It defines cuplug_add_cpu_backend() and cuplug_add_cuda_backend(); see cuplug.cmake.
include("${CMAKE_CURRENT_LIST_DIR}/cuplug.cmake")
