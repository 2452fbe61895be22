# dg_find_cutlass_include(<out_var>): the CUTLASS include directory (holding cutlass/cutlass.h and cute/), or "".
# Looks in order at: env CUTLASS_INCLUDE_DIR, the monorepo's build/third_party/cutlass_include, and the
# nvidia-cutlass wheel (`import cutlass_library` -> <pkg>/source/include).
function(dg_find_cutlass_include out_var)
  set(_candidates "")
  if(DEFINED ENV{CUTLASS_INCLUDE_DIR})
    list(APPEND _candidates "$ENV{CUTLASS_INCLUDE_DIR}")
  endif()
  list(APPEND _candidates "${CMAKE_CURRENT_SOURCE_DIR}/../../build/third_party/cutlass_include")
  find_package(Python COMPONENTS Interpreter QUIET)
  if(Python_EXECUTABLE)
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c
              "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
      OUTPUT_VARIABLE _wheel_inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND _wheel_inc)
      list(APPEND _candidates "${_wheel_inc}")
    endif()
  endif()
  foreach(_dir IN LISTS _candidates)
    if(EXISTS "${_dir}/cutlass/cutlass.h" AND EXISTS "${_dir}/cute/tensor.hpp")
      get_filename_component(_abs "${_dir}" ABSOLUTE)
      set(${out_var} "${_abs}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out_var} "" PARENT_SCOPE)
endfunction()
