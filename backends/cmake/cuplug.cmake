# cuplug CMake helpers: build a backend's CPU twin and its CUDA variants.
#
#   cuplug_add_cpu_backend(<name> SOURCES <files...>)
#       -> target cuplug_<name>_cpu, file libcuplug_<name>_cpu.so
#   cuplug_add_cuda_backend(<name> SOURCES <files...> [VARIANTS <v...>] [MATRIX <json>])
#       -> one target cuplug_<name>_<variant> per variant, each file
#          <build>/<variant>/libcuplug_<name>.so
#
# The variants and their architectures are data (variants.json beside this
# directory, or MATRIX); a variant's "sass"/"ptx" lists name arch numbers, and
# "all"/"newest" expand from `nvcc --list-gpu-arch`, so a new toolkit's archs
# need no edit here. Every backend exports only cuplug_backend_* (version
# script), builds position-independent with hidden visibility, and links the
# static CUDA runtime only. CUPLUG_SYSROOT (optional) links against an old
# glibc sysroot so the wheel gets an old manylinux tag.

include_guard(GLOBAL)

set(CUPLUG_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
get_filename_component(_cuplug_backends_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(CUPLUG_INCLUDE_DIRS "${_cuplug_backends_dir}/include" "${_cuplug_backends_dir}/common"
    CACHE INTERNAL "cuplug ABI and common headers")
set(CUPLUG_DEFAULT_MATRIX "${_cuplug_backends_dir}/variants.json" CACHE INTERNAL "")
set(CUPLUG_SYSROOT "" CACHE PATH "glibc sysroot to link against (empty: the host's)")

function(_cuplug_common_link target)
  target_include_directories(${target} PRIVATE ${CUPLUG_INCLUDE_DIRS})
  set_target_properties(${target} PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden)
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${CUPLUG_CMAKE_DIR}/cuplug_exports.map"
    "LINKER:--no-undefined" "LINKER:--as-needed" "LINKER:--exclude-libs,ALL"
    "LINKER:--build-id=none"
    # No .symtab: it holds nvcc's tmpxft_<pid> file names, the only bytes that
    # differed between two clean builds. The dynamic ABI symbols stay.
    "LINKER:--strip-all")
  if(CUPLUG_SYSROOT)
    set(_s "${CUPLUG_SYSROOT}")
    # Debian's multiarch directory of the target: x86_64-linux-gnu, or
    # aarch64-linux-gnu when cross-building (aarch64-linux-gnu.cmake).
    set(_m "${CMAKE_SYSTEM_PROCESSOR}-linux-gnu")
    target_link_options(${target} PRIVATE
      "--sysroot=${_s}" "-B${_s}/usr/lib/${_m}"
      "-L${_s}/usr/lib/${_m}" "-L${_s}/lib/${_m}")
  endif()
  target_link_libraries(${target} PRIVATE pthread dl rt m)
endfunction()

function(cuplug_add_cpu_backend name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "cuplug_add_cpu_backend(${name}): SOURCES is required")
  endif()
  set(target cuplug_${name}_cpu)
  add_library(${target} SHARED ${ARG_SOURCES})
  set_target_properties(${target} PROPERTIES C_STANDARD 11 OUTPUT_NAME cuplug_${name}_cpu)
  target_compile_definitions(${target} PRIVATE CUPLUG_BACKEND_NAME="${name}")
  # No FMA contraction: float math gives the same bits as the CUDA kernels.
  target_compile_options(${target} PRIVATE -O3 -Wall -Wextra -ffp-contract=off)
  _cuplug_common_link(${target})
endfunction()

# Reads `nvcc --list-gpu-arch` into a sorted list of arch numbers (75 80 ...).
function(_cuplug_toolkit_archs out_var)
  execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --list-gpu-arch
                  OUTPUT_VARIABLE _out RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "cuplug: `${CMAKE_CUDA_COMPILER} --list-gpu-arch` failed: ${_err}")
  endif()
  string(REGEX MATCHALL "compute_[0-9]+" _found "${_out}")
  set(_archs "")
  foreach(_a IN LISTS _found)
    string(REPLACE "compute_" "" _n "${_a}")
    list(APPEND _archs "${_n}")
  endforeach()
  list(REMOVE_DUPLICATES _archs)
  list(SORT _archs COMPARE NATURAL)
  set(${out_var} "${_archs}" PARENT_SCOPE)
endfunction()

# Expands one variant of the matrix into CMake CUDA_ARCHITECTURES entries.
function(_cuplug_variant_archs out_var matrix variant toolkit_archs)
  string(JSON _min GET "${matrix}" min_arch)
  string(JSON _entry ERROR_VARIABLE _missing GET "${matrix}" variants ${variant})
  if(_missing)
    string(JSON _n LENGTH "${matrix}" variants)
    set(_known "")
    math(EXPR _last "${_n} - 1")
    foreach(_i RANGE ${_last})
      string(JSON _k MEMBER "${matrix}" variants ${_i})
      list(APPEND _known ${_k})
    endforeach()
    message(FATAL_ERROR "cuplug: unknown variant '${variant}' (the matrix has: ${_known})")
  endif()
  set(_usable "")
  foreach(_a IN LISTS toolkit_archs)
    if(_a GREATER_EQUAL _min)
      list(APPEND _usable ${_a})
    endif()
  endforeach()
  list(GET _usable -1 _newest)
  set(_result "")
  set(_sass_names "")
  set(_ptx_names "")
  foreach(_kind sass ptx)
    string(JSON _type TYPE "${_entry}" ${_kind})
    string(JSON _value GET "${_entry}" ${_kind})
    if(_type STREQUAL "STRING")
      if(_kind STREQUAL "sass" AND _value STREQUAL "all")
        set(_list ${_usable})
      elseif(_value STREQUAL "newest")
        set(_list ${_newest})
      else()
        message(FATAL_ERROR "cuplug: variant '${variant}': ${_kind} = \"${_value}\" (use a list, \"all\" or \"newest\")")
      endif()
    else()
      set(_list "")
      string(JSON _len LENGTH "${_entry}" ${_kind})
      if(_len GREATER 0)
        math(EXPR _last "${_len} - 1")
        foreach(_i RANGE ${_last})
          string(JSON _a GET "${_entry}" ${_kind} ${_i})
          list(APPEND _list ${_a})
        endforeach()
      endif()
    endif()
    foreach(_a IN LISTS _list)
      if(NOT _a IN_LIST toolkit_archs)
        message(FATAL_ERROR "cuplug: variant '${variant}' names arch ${_a}, which this nvcc "
                            "(${CMAKE_CUDA_COMPILER_VERSION}) does not support: ${toolkit_archs}")
      endif()
      if(_kind STREQUAL "sass")
        list(APPEND _result "${_a}-real")
        list(APPEND _sass_names "sm_${_a}")
      else()
        list(APPEND _result "${_a}-virtual")
        list(APPEND _ptx_names "compute_${_a}")
      endif()
    endforeach()
  endforeach()
  list(JOIN _sass_names "," _sass_joined)
  list(JOIN _ptx_names "," _ptx_joined)
  set(${out_var} "${_result}" PARENT_SCOPE)
  set(${out_var}_SASS "${_sass_joined}" PARENT_SCOPE)
  set(${out_var}_PTX "${_ptx_joined}" PARENT_SCOPE)
endfunction()

function(cuplug_add_cuda_backend name)
  cmake_parse_arguments(ARG "" "MATRIX" "SOURCES;VARIANTS" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "cuplug_add_cuda_backend(${name}): SOURCES is required")
  endif()
  if(NOT ARG_MATRIX)
    set(ARG_MATRIX "${CUPLUG_DEFAULT_MATRIX}")
  endif()
  file(READ "${ARG_MATRIX}" _matrix)
  if(NOT ARG_VARIANTS)
    string(JSON _n LENGTH "${_matrix}" variants)
    math(EXPR _last "${_n} - 1")
    foreach(_i RANGE ${_last})
      string(JSON _k MEMBER "${_matrix}" variants ${_i})
      list(APPEND ARG_VARIANTS ${_k})
    endforeach()
  endif()

  # The only find_package(CUDAToolkit) of the project: CUDA stays in the backend.
  find_package(CUDAToolkit REQUIRED)
  _cuplug_toolkit_archs(_toolkit_archs)
  message(STATUS "cuplug: nvcc ${CMAKE_CUDA_COMPILER_VERSION} supports archs ${_toolkit_archs}")

  foreach(variant IN LISTS ARG_VARIANTS)
    _cuplug_variant_archs(_archs "${_matrix}" ${variant} "${_toolkit_archs}")
    set(target cuplug_${name}_${variant})
    add_library(${target} SHARED ${ARG_SOURCES})
    # Compile, then link with the host C++ driver: each device image is embedded
    # once (a one-step `nvcc -shared` of several -gencode targets embeds twice).
    set_target_properties(${target} PROPERTIES
      OUTPUT_NAME cuplug_${name}
      LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/${variant}"
      CUDA_ARCHITECTURES "${_archs}"
      CUDA_RUNTIME_LIBRARY Static
      CUDA_STANDARD 17
      LINKER_LANGUAGE CXX)
    target_compile_definitions(${target} PRIVATE
      CUPLUG_VARIANT="${variant}" CUPLUG_BACKEND_NAME="${name}"
      CUPLUG_SASS_LIST="${_archs_SASS}" CUPLUG_PTX_LIST="${_archs_PTX}")
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-O3 -Xcompiler=-fPIC,-fvisibility=hidden>)
    if(NOT CUPLUG_SYSROOT)
      # Host glibc: fold the C++ runtime in. With the old-glibc sysroot, gcc 12's
      # static libstdc++/libgcc_eh need newer glibc symbols, so link them
      # dynamically (the sysroot's libstdc++ 10 keeps symbol versions old).
      target_link_options(${target} PRIVATE -static-libstdc++ -static-libgcc)
    endif()
    _cuplug_common_link(${target})
    message(STATUS "cuplug: ${target} -> ${variant}/libcuplug_${name}.so, CUDA_ARCHITECTURES ${_archs}")
  endforeach()
endfunction()
