// Registration hook for the FP4-expert CUDA kernels: dg_fp4_bindings.cpp adds their entry points to the _C module.
#pragma once
#include <pybind11/pybind11.h>

void dg_register_fp4(pybind11::module_& m);
