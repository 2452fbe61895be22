# Shared CMake logic for every DeepInfer package.
#
# DEEPINFER_DEVICE (auto|cuda|ascend|cpu) picks what gets compiled. scikit-build-core passes it from
# the environment variable of the same name (see each package's pyproject.toml). `auto` builds CUDA
# sources when nvcc is found, Ascend sources when CANN is found, and neither otherwise.
# Every package installs a generated `_build_info.py` that records the choice, so a wheel can say at
# run time what it was built for.
#
# A package CMakeLists.txt is three calls:
#   deepinfer_resolve_device(DI_DEVICE)
#   deepinfer_add_compiled(<pkg> "${DI_DEVICE}" DI_COMPILED)   # builds csrc/cuda/* into deepinfer.<pkg>._C
#   deepinfer_write_build_info(<pkg> "${DI_DEVICE}" "${DI_COMPILED}")
# so kernel authors add CUDA sources by dropping files into csrc/cuda/, without editing CMake.
include_guard(GLOBAL)

set(DEEPINFER_DEVICE "auto" CACHE STRING "Device to build for: auto|cuda|ascend|cpu")
set_property(CACHE DEEPINFER_DEVICE PROPERTY STRINGS auto cuda ascend cpu)
set(DEEPINFER_CUDA_ARCHS "90a" CACHE STRING "CUDA architectures for compiled kernels (Hopper first)")

function(_deepinfer_find_nvcc out_var)
  find_program(_nvcc nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH PATH_SUFFIXES bin)
  set(${out_var} "${_nvcc}" PARENT_SCOPE)
endfunction()

function(_deepinfer_has_cann out_var)
  if(DEFINED ENV{ASCEND_HOME_PATH} OR EXISTS "/usr/local/Ascend/ascend-toolkit/latest")
    set(${out_var} TRUE PARENT_SCOPE)
  else()
    set(${out_var} FALSE PARENT_SCOPE)
  endif()
endfunction()

function(deepinfer_resolve_device out_var)
  set(_dev "${DEEPINFER_DEVICE}")
  if(NOT _dev MATCHES "^(auto|cuda|ascend|cpu)$")
    message(FATAL_ERROR "DEEPINFER_DEVICE must be one of auto|cuda|ascend|cpu, got '${_dev}'")
  endif()
  _deepinfer_find_nvcc(_nvcc)
  _deepinfer_has_cann(_cann)
  if(_dev STREQUAL "auto")
    if(_nvcc)
      set(_dev "cuda")
    elseif(_cann)
      set(_dev "ascend")
    else()
      set(_dev "cpu")
    endif()
  elseif(_dev STREQUAL "cuda" AND NOT _nvcc)
    # An explicit request must not silently produce a wheel without the kernels it asked for.
    message(FATAL_ERROR "DEEPINFER_DEVICE=cuda but nvcc was not found (put it on PATH or set CUDA_HOME)")
  elseif(_dev STREQUAL "ascend" AND NOT _cann)
    message(FATAL_ERROR "DEEPINFER_DEVICE=ascend but CANN was not found (set ASCEND_HOME_PATH)")
  endif()
  message(STATUS "DeepInfer: building for device '${_dev}' (requested '${DEEPINFER_DEVICE}')")
  set(${out_var} "${_dev}" PARENT_SCOPE)
endfunction()

# Builds the package's compiled extension `deepinfer.<pkg>._C` from csrc/cuda/*.cu|*.cpp when building
# for CUDA and such sources exist. Sets out_var to the Python tuple body of compiled backends
# ("\"cuda\"," or empty). A macro, not a function: enable_language() must run at file scope.
macro(deepinfer_add_compiled pkg device out_var)
  set(${out_var} "")
  _deepinfer_glob_sources(_di_cuda_srcs cuda "*.cu;*.cpp")
  _deepinfer_glob_sources(_di_ascend_srcs ascend "*")
  if("${device}" STREQUAL "ascend" AND _di_ascend_srcs)
    message(WARNING "DeepInfer: Ascend C sources in ${pkg}/csrc/ascend are not built yet; Python paths only")
  endif()
  if("${device}" STREQUAL "cuda" AND _di_cuda_srcs)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "${DEEPINFER_CUDA_ARCHS}")
    endif()
    enable_language(CXX)
    enable_language(CUDA)
    _deepinfer_build_cuda_module(${pkg} "${_di_cuda_srcs}")
    set(${out_var} "\"cuda\",")
  endif()
endmacro()

function(_deepinfer_glob_sources out_var subdir patterns)
  set(_globs "")
  foreach(_pat IN LISTS patterns)
    list(APPEND _globs "${CMAKE_CURRENT_SOURCE_DIR}/csrc/${subdir}/${_pat}")
  endforeach()
  file(GLOB _found CONFIGURE_DEPENDS ${_globs})
  set(${out_var} "${_found}" PARENT_SCOPE)
endfunction()

# The module is a pybind11 extension; kernel code stays free of torch headers (DESIGN.md).
function(_deepinfer_build_cuda_module pkg sources)
  find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)
  execute_process(COMMAND "${Python_EXECUTABLE}" -m pybind11 --cmakedir
    OUTPUT_VARIABLE _pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "DeepInfer: ${pkg} has CUDA sources but pybind11 is not installed for ${Python_EXECUTABLE}")
  endif()
  find_package(pybind11 CONFIG REQUIRED HINTS "${_pybind11_dir}")
  pybind11_add_module(${pkg}_C MODULE ${sources})
  set_target_properties(${pkg}_C PROPERTIES OUTPUT_NAME "_C")
  target_compile_features(${pkg}_C PRIVATE cxx_std_17 cuda_std_17)
  target_include_directories(${pkg}_C PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/csrc")
  install(TARGETS ${pkg}_C LIBRARY DESTINATION "deepinfer/${pkg}")
endfunction()

# Writes deepinfer/<pkg>/_build_info.py with the resolved device and which compiled backends exist.
function(deepinfer_write_build_info pkg device compiled_backends)
  set(_file "${CMAKE_CURRENT_BINARY_DIR}/_build_info.py")
  file(WRITE "${_file}"
    "\"\"\"Generated at build time by cmake/DeepInferDevice.cmake. Do not edit.\"\"\"\n"
    "BUILT_FOR = \"${device}\"\n"
    "COMPILED_BACKENDS = (${compiled_backends})\n")
  install(FILES "${_file}" DESTINATION "deepinfer/${pkg}")
endfunction()
