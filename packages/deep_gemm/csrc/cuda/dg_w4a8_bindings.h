// Registration hook for the W4A8 FP8-wgmma kernel: dg_w4a8_bindings.cpp adds its entry points to the _C module.
#pragma once
#include <pybind11/pybind11.h>

void dg_register_w4a8(pybind11::module_& m);
