// Registration hook of the FP8 double-buffered-promotion GEMM (dg_fp8_db_*): dg_fp8_db_bindings.cpp adds its entry
// points to the _C module.
#pragma once
#include <pybind11/pybind11.h>

void dg_register_fp8_db(pybind11::module_& m);
