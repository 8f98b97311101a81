# cuplug CMake helpers: build a backend's CPU twin and its CUDA variants.
# Reference with an example: docs/build-kit.md.
#
#   cuplug_add_cpu_backend(<name> SOURCES <files...>
#       [INCLUDE_DIRS <dirs...>] [COMPILE_DEFINITIONS <defs...>]
#       [LINK_LIBRARIES <static libs...>] [OUT_TARGETS <var>])
#       -> target cuplug_<name>_cpu, file libcuplug_<name>_cpu.so
#   cuplug_add_cuda_backend(<name> SOURCES <files...> [VARIANTS <v...>] [MATRIX <json>]
#       [INCLUDE_DIRS <dirs...>] [COMPILE_DEFINITIONS <defs...>] [CUDA_FLAGS <flags...>]
#       [LINK_LIBRARIES <static libs...>] [COMPONENTS <cublas|curand...>] [OUT_TARGETS <var>])
#       -> one target cuplug_<name>_<variant> per variant, each file
#          <build>/<variant>/libcuplug_<name>.so; OUT_TARGETS receives their names
#
# The variants and their architectures are data (variants.json beside this
# directory, or MATRIX); a variant's "sass"/"ptx" lists name arch numbers, and
# "all"/"newest" expand from `nvcc --list-gpu-arch`, so a new toolkit's archs
# need no edit here. Every backend exports only cuplug_backend_* (version
# script), builds position-independent with hidden visibility, and links the
# static CUDA runtime only; LINK_LIBRARIES takes static libraries only (a shared
# one is refused at configure time). The one exception is a toolchain component the
# project file declares ([tool.cuplug] components = ["cublas"]): the kit installs
# NVIDIA's wheel and passes CUPLUG_COMPONENTS, this file makes cuplug::<name>, and
# COMPONENTS <name> links it with an RPATH into site-packages (docs/build-kit.md). Each .cu is compiled whole-program into its
# own fat binary (no separable compilation, no device link) and the library is
# linked by the host C++ driver. CUPLUG_SYSROOT (optional) links against an old
# glibc sysroot so the wheel gets an old manylinux tag.
#
# Nothing here is cached: the kit's headers and version script are copied into
# <build>/cuplug-kit only where their content differs, so reinstalling cuplug
# (a nox venv recreated on every run) changes no compile line and no header
# mtime, and a rebuild with nothing changed compiles nothing.

include_guard(GLOBAL)

set(CUPLUG_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
get_filename_component(_cuplug_kit_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(CUPLUG_DEFAULT_MATRIX "${_cuplug_kit_dir}/variants.json")
set(CUPLUG_SYSROOT "" CACHE PATH "glibc sysroot to link against (empty: the host's)")

# Copies include/, common/ and the version script into <build>/cuplug-kit, file by
# file and only where the content differs (mtimes of unchanged files stay), and
# drops files cuplug no longer has. Once per configure; the result is a global
# property, so every directory of the project sees the same copy.
function(_cuplug_stage_kit out_var)
  get_property(_dest GLOBAL PROPERTY _CUPLUG_STAGED_KIT)
  if(NOT _dest)
    get_filename_component(_kit "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/.." ABSOLUTE)
    set(_dest "${CMAKE_BINARY_DIR}/cuplug-kit")
    file(GLOB_RECURSE _files RELATIVE "${_kit}" "${_kit}/include/*" "${_kit}/common/*")
    list(APPEND _files cmake/cuplug_exports.map)
    file(GLOB_RECURSE _old RELATIVE "${_dest}" "${_dest}/*")
    foreach(_f IN LISTS _old)
      if(NOT _f IN_LIST _files)
        file(REMOVE "${_dest}/${_f}")
      endif()
    endforeach()
    foreach(_f IN LISTS _files)
      get_filename_component(_parent "${_dest}/${_f}" DIRECTORY)
      file(MAKE_DIRECTORY "${_parent}")
      file(COPY_FILE "${_kit}/${_f}" "${_dest}/${_f}" ONLY_IF_DIFFERENT)
      # A plain `cmake --build` after cuplug changed re-runs the configure step.
      set_property(DIRECTORY "${CMAKE_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_kit}/${_f}")
    endforeach()
    set_property(GLOBAL PROPERTY _CUPLUG_STAGED_KIT "${_dest}")
  endif()
  set(${out_var} "${_dest}" PARENT_SCOPE)
endfunction()

_cuplug_stage_kit(_cuplug_staged)

# The toolchain components the project file declares, installed by `python -m cuplug.kit variants`
# (loader/cuplug/kit/components.py): one INTERFACE target cuplug::<name> each, with the component's
# headers, its shared libraries by soname (-l:libcublas.so.13) and -rpath-link for their own NEEDED.
# Its RPATH (into site-packages, where NVIDIA's wheel installs) is set on each target that links it.
set(CUPLUG_COMPONENTS "" CACHE STRING "toolchain components declared by the project file (set by cuplug.kit)")
set(_cuplug_component_names cublas curand)
foreach(_c IN LISTS CUPLUG_COMPONENTS)
  if(NOT _c IN_LIST _cuplug_component_names)
    message(FATAL_ERROR "cuplug: unknown component '${_c}' (cuplug offers: ${_cuplug_component_names})")
  endif()
  if(NOT TARGET cuplug::${_c})
    add_library(cuplug::${_c} INTERFACE IMPORTED)
    set(_libs "")
    foreach(_so IN LISTS CUPLUG_COMPONENT_${_c}_LIBRARIES)
      list(APPEND _libs "-l:${_so}")
    endforeach()
    set_target_properties(cuplug::${_c} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${CUPLUG_COMPONENT_${_c}_INCLUDE_DIR}"
      INTERFACE_LINK_DIRECTORIES "${CUPLUG_COMPONENT_${_c}_LIBRARY_DIR}"
      INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${CUPLUG_COMPONENT_${_c}_LIBRARY_DIR}"
      INTERFACE_LINK_LIBRARIES "${_libs}")
    set_property(GLOBAL APPEND PROPERTY _CUPLUG_COMPONENT_TARGETS cuplug::${_c})
  endif()
endforeach()

# The message for a component that is used but not declared.
function(_cuplug_undeclared_component out_var where component)
  set(${out_var} "${where}: the component '${component}' is not declared. Declare it in the backend's project file (pyproject.toml: [tool.cuplug] components = [\"${component}\"]) and build with `python -m cuplug.kit variants`: the kit installs NVIDIA's pinned wheel, and the backend wheel then requires it and finds it through an RPATH into site-packages (docs/build-kit.md)." PARENT_SCOPE)
endfunction()
# For projects that want the ABI headers on a target of their own (a normal
# variable of the directory that found cuplug, never a cache entry).
set(CUPLUG_INCLUDE_DIRS "${_cuplug_staged}/include" "${_cuplug_staged}/common")

# Refuses anything in `items` that links a shared library: directly (an imported or
# project SHARED target, an UNKNOWN imported library whose file is a .so, a .so path,
# -lname / a bare name that the linker resolves to libname.so, CUDA::x of
# FindCUDAToolkit without _static) or through a target's INTERFACE_LINK_LIBRARIES.
# `where` starts the message.
function(_cuplug_refuse_shared where items)
  # The C runtime libraries a backend may need (check_linkage allows the same), and
  # CUDA's shared libraries by name, for a message that says what to link instead.
  set(_system_libs c m dl pthread rt stdc++ gcc_s)
  set(_cuda_re "^(cuda|cuda_driver|cudart|cublas|cublasLt|cufft|cufftw|curand|cusolver|cusolverMg|cusparse|cusparseLt|nvrtc|nvrtc_builtins|nvJitLink|nvjpeg|npp[a-z]*|nvToolsExt|cupti|cufile|cudla|nvidia-ml|nvml|nvfatbin|nvblas|OpenCL)$")
  set(_seen "")
  set(_queue ${items})
  list(LENGTH _queue _left)
  while(_left GREATER 0)  # not while(_queue): a list ending in "x-NOTFOUND" is false
    list(POP_FRONT _queue _item)
    list(LENGTH _queue _left)
    if(_item MATCHES "^\\$<LINK_ONLY:(.+)>$")
      set(_item "${CMAKE_MATCH_1}")
    endif()
    if(_item STREQUAL "" OR _item MATCHES "^::@" OR _item MATCHES "^\\$<" OR _item IN_LIST _seen)
      continue()  # directory markers; other generator expressions are not followed
    endif()
    list(APPEND _seen "${_item}")
    get_property(_declared GLOBAL PROPERTY _CUPLUG_COMPONENT_TARGETS)
    if(_item IN_LIST _declared)
      continue()  # a declared component: linked by soname, required by the wheel, found through its RPATH
    endif()
    if(_item MATCHES "^cuplug::(.+)$")
      _cuplug_undeclared_component(_msg "${where}" "${CMAKE_MATCH_1}")
      message(FATAL_ERROR "${_msg}")
    endif()
    set(_shared FALSE)
    set(_detail "")  # why it is shared, for the message
    string(REGEX REPLACE "^CUDA::" "" _base "${_item}")
    if(TARGET "${_item}")
      set(_t "${_item}")
      get_target_property(_aliased "${_t}" ALIASED_TARGET)
      if(_aliased)
        set(_t "${_aliased}")
      endif()
      get_target_property(_type "${_t}" TYPE)
      set(_files "")
      get_target_property(_imported "${_t}" IMPORTED)
      if(_imported)
        get_target_property(_configs "${_t}" IMPORTED_CONFIGURATIONS)
        set(_props IMPORTED_LOCATION IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_NOCONFIG)
        foreach(_c IN LISTS _configs)
          string(TOUPPER "${_c}" _c)
          list(APPEND _props IMPORTED_LOCATION_${_c})
        endforeach()
        foreach(_p IN LISTS _props)
          get_target_property(_loc "${_t}" ${_p})
          if(_loc)
            list(APPEND _files "${_loc}")
          endif()
        endforeach()
      endif()
      if(_type STREQUAL "SHARED_LIBRARY" OR _type STREQUAL "MODULE_LIBRARY")
        set(_shared TRUE)
        set(_detail " (a ${_type} target)")
      endif()
      foreach(_f IN LISTS _files)
        if(_f MATCHES "\\.so(\\.[0-9]+)*$")
          set(_shared TRUE)
          set(_detail " (${_f})")
          get_filename_component(_base "${_f}" NAME)
        endif()
      endforeach()
      if(NOT _shared)
        get_target_property(_iface "${_t}" INTERFACE_LINK_LIBRARIES)
        if(_iface)
          foreach(_dep IN LISTS _iface)
            string(MAKE_C_IDENTIFIER "${_dep}" _key)
            set(_via_${_key} "${_item}")
            list(APPEND _queue "${_dep}")
          endforeach()
          list(LENGTH _queue _left)
        endif()
      endif()
    elseif(_item MATCHES "::")
      # A namespaced name that is no target: CUDA::x without _static is FindCUDAToolkit's shared one.
      if(_item MATCHES "^CUDA::" AND NOT _item MATCHES "_static$" AND NOT _base MATCHES "^(toolkit|nvtx3|cudart_static_deps)$")
        set(_shared TRUE)
        string(REGEX REPLACE "^cuda_driver$" "cuda" _file "${_base}")
        set(_detail " (FindCUDAToolkit's target for lib${_file}.so; this toolkit does not have it either)")
      endif()
    elseif(_item MATCHES "\\.so(\\.[0-9]+)*$")
      set(_shared TRUE)
      get_filename_component(_base "${_item}" NAME)
    elseif(_item MATCHES "\\.a$" OR _item MATCHES "^-l:.+\\.a$" OR _item MATCHES "/")
      # a static archive, or another linker input file (an object): fine
    elseif(_item MATCHES "^-l(.+)$" OR NOT _item MATCHES "^-")
      if(_item MATCHES "^-l(.+)$")
        set(_base "${CMAKE_MATCH_1}")
      endif()
      if(NOT _base IN_LIST _system_libs AND NOT _base MATCHES "_static$")
        set(_shared TRUE)
        set(_detail " (linked as -l${_base}, which takes lib${_base}.so wherever there is one)")
      endif()
    endif()
    if(_shared)
      string(REGEX REPLACE "^lib" "" _base "${_base}")
      string(REGEX REPLACE "\\.so(\\.[0-9]+)*$" "" _base "${_base}")
      if(_base MATCHES "${_cuda_re}")
        set(_what "a shared CUDA library")
      else()
        set(_what "a shared library")
      endif()
      string(MAKE_C_IDENTIFIER "${_item}" _key)
      if(DEFINED _via_${_key})
        set(_what "${_what}, linked through ${_via_${_key}}")
      endif()
      set(_why "A backend links static libraries only: its wheel must not depend on a shared library, and on a CUDA one least of all (users' machines have the NVIDIA driver, not the CUDA toolkit; the build check refuses any NEEDED beyond the C runtime).")
      if(_base MATCHES "^(cuda|cuda_driver|nvidia-ml|nvml)$")
        set(_fix "It is the NVIDIA driver: cuplug finds and loads it at run time, and the static CUDA runtime reaches it by itself; never link it.")
      elseif(_base STREQUAL "cudart")
        set(_fix "The static CUDA runtime is linked already (CUDA_RUNTIME_LIBRARY Static): drop it.")
      elseif(_base MATCHES "^(cublas|cublasLt|curand)$")
        string(REGEX REPLACE "^cublasLt$" "cublas" _component "${_base}")
        set(_fix "Use the _static variant: CUDA::${_base}_static (lib${_base}_static.a), where the toolkit has it; or declare cuplug's component '${_component}' (pyproject.toml: [tool.cuplug] components = [\"${_component}\"]; cuplug_add_cuda_backend(... COMPONENTS ${_component})): NVIDIA's wheel, required by the backend wheel (docs/build-kit.md).")
      elseif(_base MATCHES "${_cuda_re}")
        set(_fix "Use the _static variant: CUDA::${_base}_static (lib${_base}_static.a).")
      else()
        set(_fix "Link its static archive (lib${_base}.a, -l:lib${_base}.a, or a STATIC target with POSITION_INDEPENDENT_CODE ON), or add its sources to SOURCES.")
      endif()
      message(FATAL_ERROR "${where}: ${_item} is ${_what}${_detail}. ${_why} ${_fix}")
    endif()
  endwhile()
endfunction()

# Checked at the end of the calling directory, after any target_*() call on the
# returned targets: static libraries only, no separable compilation or device link.
function(_cuplug_check_targets fn name)
  get_property(_declared GLOBAL PROPERTY _CUPLUG_COMPONENT_TARGETS)
  foreach(_t IN LISTS ARGN)
    get_target_property(_libs ${_t} LINK_LIBRARIES)
    if(_libs)
      _cuplug_refuse_shared("${fn}(${name}): LINK_LIBRARIES of ${_t}" "${_libs}")
      # A declared component linked (COMPONENTS, or a later target_link_libraries): its RPATH, relative to
      # the artifact's place in site-packages (<package>/<variant>/lib.so), and no build-tree RPATH.
      set(_rpath "")
      foreach(_lib IN LISTS _libs)
        if(_lib IN_LIST _declared)
          if(fn STREQUAL "cuplug_add_cpu_backend")
            message(FATAL_ERROR "${fn}(${name}): ${_t} links ${_lib}: the CPU twin runs where no CUDA is; "
                                "only a CUDA variant may link a toolchain component")
          endif()
          string(REGEX REPLACE "^cuplug::" "" _c "${_lib}")
          list(APPEND _rpath "${CUPLUG_COMPONENT_${_c}_RPATH}")
        endif()
      endforeach()
      if(_rpath)
        list(REMOVE_DUPLICATES _rpath)
        set_target_properties(${_t} PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH "${_rpath}")
      endif()
    endif()
    get_target_property(_lto ${_t} CUPLUG_LTO_VARIANT)  # an LTO variant is device-linked by design
    foreach(_p CUDA_SEPARABLE_COMPILATION CUDA_RESOLVE_DEVICE_SYMBOLS)
      get_target_property(_v ${_t} ${_p})
      if(_v AND NOT _lto)
        message(FATAL_ERROR "${fn}(${name}): ${_t} has ${_p} ON. cuplug compiles each .cu whole-program "
                            "into its own fat binary: a device link keeps SASS only, so the ptx variant "
                            "would be empty and the fatbin variant would lose its PTX.")
      endif()
    endforeach()
    get_target_property(_linker ${_t} LINKER_LANGUAGE)
    if(_linker AND NOT _linker MATCHES "^(C|CXX)$")
      message(FATAL_ERROR "${fn}(${name}): ${_t} has LINKER_LANGUAGE ${_linker}. Linking through nvcc "
                          "runs a device link that embeds a second, kernel-less image per architecture; "
                          "cuplug links with the host compiler.")
    endif()
  endforeach()
endfunction()

# Shared by both functions: parses the common options, checks them, and returns
# them as ARG_* in the caller's scope.
macro(_cuplug_parse fn name one multi)
  set(_one OUT_TARGETS ${one})
  set(_multi SOURCES INCLUDE_DIRS COMPILE_DEFINITIONS LINK_LIBRARIES ${multi})
  cmake_parse_arguments(ARG "" "${_one}" "${_multi}" ${ARGN})
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "${fn}(${name}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "${fn}(${name}): SOURCES is required")
  endif()
  if(NOT name MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
    message(FATAL_ERROR "${fn}(${name}): the name must be a C identifier")
  endif()
endmacro()

function(_cuplug_common_link target)
  _cuplug_stage_kit(_kit)
  target_include_directories(${target} PRIVATE "${_kit}/include" "${_kit}/common")
  # Pins the glibc symbols newer glibcs version anew (expf, log, pow, ...) to manylinux_2_17's versions, so a
  # twin calling libm stays manylinux_2_17 on any build machine (include/cuplug/glibc_floor.h says which).
  set(_floor "${_kit}/include/cuplug/glibc_floor.h")
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:C,CXX>:SHELL:-include ${_floor}>"
    "$<$<COMPILE_LANGUAGE:CUDA>:SHELL:-Xcompiler -include,${_floor}>")
  set_target_properties(${target} PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    LINK_DEPENDS "${_kit}/cmake/cuplug_exports.map")
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${_kit}/cmake/cuplug_exports.map"
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

# The author's options, the same on every target of a backend.
function(_cuplug_user_options target)
  cmake_parse_arguments(U "" "" "INCLUDE_DIRS;COMPILE_DEFINITIONS;LINK_LIBRARIES" ${ARGN})
  if(U_INCLUDE_DIRS)  # relative paths are relative to the calling CMakeLists.txt
    target_include_directories(${target} PRIVATE ${U_INCLUDE_DIRS})
  endif()
  if(U_COMPILE_DEFINITIONS)
    target_compile_definitions(${target} PRIVATE ${U_COMPILE_DEFINITIONS})
  endif()
  if(U_LINK_LIBRARIES)
    target_link_libraries(${target} PRIVATE ${U_LINK_LIBRARIES})
  endif()
endfunction()

macro(_cuplug_defer_checks fn name targets)
  cmake_language(EVAL CODE "cmake_language(DEFER CALL _cuplug_check_targets [[${fn}]] [[${name}]] ${targets})")
endmacro()

function(cuplug_add_cpu_backend name)
  _cuplug_parse(cuplug_add_cpu_backend "${name}" "" "" ${ARGN})
  _cuplug_refuse_shared("cuplug_add_cpu_backend(${name}): LINK_LIBRARIES" "${ARG_LINK_LIBRARIES}")
  set(target cuplug_${name}_cpu)
  add_library(${target} SHARED ${ARG_SOURCES})
  set_target_properties(${target} PROPERTIES C_STANDARD 11 OUTPUT_NAME cuplug_${name}_cpu)
  target_compile_definitions(${target} PRIVATE CUPLUG_BACKEND_NAME="${name}")
  # No FMA contraction: float math gives the same bits as the CUDA kernels.
  # -Wno-missing-field-initializers: op tables omit trailing fields on purpose.
  target_compile_options(${target} PRIVATE -O3 -Wall -Wextra -Wno-missing-field-initializers -ffp-contract=off)
  _cuplug_common_link(${target})
  _cuplug_user_options(${target} INCLUDE_DIRS ${ARG_INCLUDE_DIRS}
                       COMPILE_DEFINITIONS ${ARG_COMPILE_DEFINITIONS} LINK_LIBRARIES ${ARG_LINK_LIBRARIES})
  _cuplug_defer_checks(cuplug_add_cpu_backend "${name}" ${target})
  if(ARG_OUT_TARGETS)
    set(${ARG_OUT_TARGETS} ${target} PARENT_SCOPE)
  endif()
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

# The JSON array ``key`` of ``json`` as a CMake list ("" when the key is absent or the array empty).
function(_cuplug_json_list out_var json key)
  set(_list "")
  string(JSON _len ERROR_VARIABLE _absent LENGTH "${json}" ${key})
  if(NOT _absent AND _len GREATER 0)
    math(EXPR _last "${_len} - 1")
    foreach(_i RANGE ${_last})
      string(JSON _a GET "${json}" ${key} ${_i})
      list(APPEND _list ${_a})
    endforeach()
  endif()
  set(${out_var} "${_list}" PARENT_SCOPE)
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
      _cuplug_json_list(_list "${_entry}" ${_kind})
    endif()
    foreach(_a IN LISTS _list)
      # 90 (sm_90), 90a (arch-specific, CUDA >= 12.0), 100f (family, CUDA >= 12.9): contract/targets.py
      string(REGEX REPLACE "[af]$" "" _num "${_a}")
      if(NOT _num IN_LIST toolkit_archs)
        message(FATAL_ERROR "cuplug: variant '${variant}' names arch ${_a}, which this nvcc "
                            "(${CMAKE_CUDA_COMPILER_VERSION}) does not support: ${toolkit_archs}")
      endif()
      if(_a MATCHES "f$" AND CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.9)
        message(FATAL_ERROR "cuplug: variant '${variant}' names the family target ${_a}, which needs CUDA >= 12.9 "
                            "(this nvcc is ${CMAKE_CUDA_COMPILER_VERSION})")
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
  # "lto": LTO-IR targets (docs/lto.md), linked for the exact GPU at load by nvJitLink. Optional; listed numbers only.
  _cuplug_json_list(_lto "${_entry}" lto)
  foreach(_a IN LISTS _lto)
    if(NOT _a IN_LIST toolkit_archs)
      message(FATAL_ERROR "cuplug: variant '${variant}' names LTO-IR arch ${_a}, which this nvcc "
                          "(${CMAKE_CUDA_COMPILER_VERSION}) does not support: ${toolkit_archs}")
    endif()
  endforeach()
  list(JOIN _sass_names "," _sass_joined)
  list(JOIN _ptx_names "," _ptx_joined)
  set(${out_var} "${_result}" PARENT_SCOPE)
  set(${out_var}_SASS "${_sass_joined}" PARENT_SCOPE)
  set(${out_var}_PTX "${_ptx_joined}" PARENT_SCOPE)
  set(${out_var}_LTO "${_lto}" PARENT_SCOPE)
endfunction()

# nvcc names a relocatable module's symbols (its module id among them) from random numbers unless it is seeded
# (-frandom-seed), so an LTO variant differed from build to build. Each .cu gets its own seed, the backend's name
# and its path below the source directory (nvcc leaves one seed per file to the user; two backends' kernels.cu
# differ), only where an LTO variant compiles it. Whether this nvcc has the option is asked of its --help (13.0
# has it, 12.4 not): without it the variant stays unreproducible (docs/lto.md).
function(_cuplug_seed_relocatable target backend sources)
  get_property(_known GLOBAL PROPERTY CUPLUG_NVCC_SEEDS SET)
  if(NOT _known)
    execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --help OUTPUT_VARIABLE _help ERROR_QUIET)
    string(FIND "${_help}" "--frandom-seed" _at)
    if(_at LESS 0)
      set_property(GLOBAL PROPERTY CUPLUG_NVCC_SEEDS OFF)
    else()
      set_property(GLOBAL PROPERTY CUPLUG_NVCC_SEEDS ON)
    endif()
  endif()
  get_property(_seeds GLOBAL PROPERTY CUPLUG_NVCC_SEEDS)
  if(NOT _seeds)
    return()
  endif()
  foreach(_s IN LISTS sources)
    get_source_file_property(_seeded "${_s}" TARGET_DIRECTORY ${target} CUPLUG_SEEDED)
    if(NOT _s MATCHES "\\.cu$" OR _seeded)
      continue()
    endif()
    get_filename_component(_abs "${_s}" ABSOLUTE)
    file(RELATIVE_PATH _rel "${CMAKE_CURRENT_SOURCE_DIR}" "${_abs}")
    set_property(SOURCE "${_s}" TARGET_DIRECTORY ${target} APPEND PROPERTY COMPILE_OPTIONS
      "$<$<BOOL:$<TARGET_PROPERTY:CUPLUG_LTO_VARIANT>>:-frandom-seed=cuplug:${backend}:${_rel}>")
    set_property(SOURCE "${_s}" TARGET_DIRECTORY ${target} PROPERTY CUPLUG_SEEDED ON)
  endforeach()
endfunction()

# An LTO variant (docs/lto.md): every .cu compiled relocatable with LTO-IR beside the variant's SASS; the device
# link (nvlink, SASS only) makes the library's registered image, and cuplug_lto_image.cpp swaps in the image the
# loader links for the GPU at load (--wrap of the runtime's registration).
function(_cuplug_lto_variant target backend lto_archs sources)
  _cuplug_stage_kit(_kit)
  _cuplug_seed_relocatable(${target} ${backend} "${sources}")
  set(_names "")
  foreach(_a IN LISTS lto_archs)
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:--generate-code=arch=compute_${_a},code=lto_${_a}>")
    list(APPEND _names "lto_${_a}")
  endforeach()
  list(JOIN _names "," _joined)
  target_sources(${target} PRIVATE "${_kit}/common/cuplug_lto_image.cpp")
  set_target_properties(${target} PROPERTIES
    CUDA_SEPARABLE_COMPILATION ON CUDA_RESOLVE_DEVICE_SYMBOLS ON CUPLUG_LTO_VARIANT ON)
  target_compile_definitions(${target} PRIVATE CUPLUG_LTO_LIST="${_joined}")
  target_link_options(${target} PRIVATE "LINKER:--wrap=__cudaRegisterFatBinary")
endfunction()

function(cuplug_add_cuda_backend name)
  _cuplug_parse(cuplug_add_cuda_backend "${name}" MATRIX "VARIANTS;CUDA_FLAGS;COMPONENTS" ${ARGN})
  set(_component_targets "")
  foreach(_c IN LISTS ARG_COMPONENTS)
    if(NOT _c IN_LIST _cuplug_component_names)
      message(FATAL_ERROR "cuplug_add_cuda_backend(${name}): COMPONENTS ${_c}: cuplug offers ${_cuplug_component_names} (cuBLASLt is part of cublas)")
    endif()
    if(NOT TARGET cuplug::${_c})
      _cuplug_undeclared_component(_msg "cuplug_add_cuda_backend(${name}): COMPONENTS" "${_c}")
      message(FATAL_ERROR "${_msg}")
    endif()
    list(APPEND _component_targets cuplug::${_c})
  endforeach()
  foreach(_flag IN LISTS ARG_CUDA_FLAGS)
    if(_flag MATCHES "^(-arch|--gpu-architecture|-gencode|--generate-code|-code|--gpu-code)([= ]|$)")
      message(FATAL_ERROR "cuplug_add_cuda_backend(${name}): CUDA_FLAGS has ${_flag}; the architectures "
                          "come from the variant matrix (MATRIX, VARIANTS), one set per variant")
    endif()
    if(_flag MATCHES "^(-rdc|--relocatable-device-code|-dc|--device-c|-dlink|--device-link|-dlto|--dlink-time-opt)([= ]|$)")
      message(FATAL_ERROR "cuplug_add_cuda_backend(${name}): CUDA_FLAGS has ${_flag}; cuplug compiles each "
                          ".cu whole-program (a device link keeps SASS only: the ptx variant would be empty)")
    endif()
  endforeach()
  if(NOT ARG_MATRIX)
    get_filename_component(ARG_MATRIX "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../variants.json" ABSOLUTE)
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
  _cuplug_refuse_shared("cuplug_add_cuda_backend(${name}): LINK_LIBRARIES" "${ARG_LINK_LIBRARIES}")
  _cuplug_toolkit_archs(_toolkit_archs)
  message(STATUS "cuplug: nvcc ${CMAKE_CUDA_COMPILER_VERSION} supports archs ${_toolkit_archs}")

  set(_targets "")
  foreach(variant IN LISTS ARG_VARIANTS)
    _cuplug_variant_archs(_archs "${_matrix}" ${variant} "${_toolkit_archs}")
    set(target cuplug_${name}_${variant})
    add_library(${target} SHARED ${ARG_SOURCES})
    # Each .cu is compiled on its own into an object with its own fat binary (one
    # image per architecture); the host C++ driver links them, so no device link
    # adds a second image (a one-step `nvcc -shared` of several -gencode targets does).
    set_target_properties(${target} PROPERTIES
      OUTPUT_NAME cuplug_${name}
      LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/${variant}"
      CUDA_ARCHITECTURES "${_archs}"
      CUDA_RUNTIME_LIBRARY Static
      CUDA_SEPARABLE_COMPILATION OFF
      CUDA_STANDARD 17
      CXX_STANDARD 17
      LINKER_LANGUAGE CXX)
    target_compile_definitions(${target} PRIVATE
      CUPLUG_VARIANT="${variant}" CUPLUG_BACKEND_NAME="${name}"
      CUPLUG_SASS_LIST="${_archs_SASS}" CUPLUG_PTX_LIST="${_archs_PTX}")
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-O3 -Xcompiler=-fPIC,-fvisibility=hidden>)
    foreach(_flag IN LISTS ARG_CUDA_FLAGS)
      target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:${_flag}>")
    endforeach()
    # Host-only sources (.c/.cpp) of the backend see cuda_runtime.h too.
    foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
      target_include_directories(${target} PRIVATE "$<$<COMPILE_LANGUAGE:C,CXX>:${_dir}>")
    endforeach()
    if(NOT CUPLUG_SYSROOT)
      # Host glibc: fold the C++ runtime in. With the old-glibc sysroot, gcc 12's
      # static libstdc++/libgcc_eh need newer glibc symbols, so link them
      # dynamically (the sysroot's libstdc++ 10 keeps symbol versions old).
      target_link_options(${target} PRIVATE -static-libstdc++ -static-libgcc)
    endif()
    _cuplug_common_link(${target})
    _cuplug_user_options(${target} INCLUDE_DIRS ${ARG_INCLUDE_DIRS}
                         COMPILE_DEFINITIONS ${ARG_COMPILE_DEFINITIONS} LINK_LIBRARIES ${ARG_LINK_LIBRARIES})
    if(_component_targets)
      target_link_libraries(${target} PRIVATE ${_component_targets})
    endif()
    if(_archs_LTO)
      _cuplug_lto_variant(${target} ${name} "${_archs_LTO}" "${ARG_SOURCES}")
    endif()
    list(APPEND _targets ${target})
    message(STATUS "cuplug: ${target} -> ${variant}/libcuplug_${name}.so, CUDA_ARCHITECTURES ${_archs}")
  endforeach()
  _cuplug_defer_checks(cuplug_add_cuda_backend "${name}" "${_targets}")
  if(ARG_OUT_TARGETS)
    set(${ARG_OUT_TARGETS} ${_targets} PARENT_SCOPE)
  endif()
endfunction()
