# Shared CMake logic for every DeepInfer package.
#
# DEEPINFER_DEVICE (auto|cuda|ascend|cpu) picks what gets compiled. scikit-build-core passes it from
# the environment variable of the same name (see each package's pyproject.toml). `auto` builds CUDA
# sources when nvcc is found, Ascend sources when CANN is found, and neither otherwise.
# Every package installs a generated `_build_info.py` that records the choice, so a wheel can say at
# run time what it was built for.

set(DEEPINFER_DEVICE "auto" CACHE STRING "Device to build for: auto|cuda|ascend|cpu")
set_property(CACHE DEEPINFER_DEVICE PROPERTY STRINGS auto cuda ascend cpu)

function(deepinfer_resolve_device out_var)
  set(_dev "${DEEPINFER_DEVICE}")
  if(NOT _dev MATCHES "^(auto|cuda|ascend|cpu)$")
    message(FATAL_ERROR "DEEPINFER_DEVICE must be one of auto|cuda|ascend|cpu, got '${_dev}'")
  endif()
  if(_dev STREQUAL "auto")
    find_program(_nvcc nvcc HINTS ENV CUDA_HOME PATH_SUFFIXES bin)
    if(_nvcc)
      set(_dev "cuda")
    elseif(DEFINED ENV{ASCEND_HOME_PATH} OR EXISTS "/usr/local/Ascend/ascend-toolkit/latest")
      set(_dev "ascend")
    else()
      set(_dev "cpu")
    endif()
  endif()
  message(STATUS "DeepInfer: building for device '${_dev}' (requested '${DEEPINFER_DEVICE}')")
  set(${out_var} "${_dev}" PARENT_SCOPE)
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
