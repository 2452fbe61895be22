// Registration hook for the warp-specialised kernels: fm_ws_bindings.cpp adds their entry points to the _C module.
#pragma once
#include <pybind11/pybind11.h>

void fm_register_ws(pybind11::module_& m);
