// Entry points of the FP4-expert CUDA kernels (dg_fp4_*.cu), added to deepinfer.deep_gemm._C by dg_module.cpp.
// Tensors arrive as data_ptr() integers; the Python wrapper is backends/cuda/cuda_fp4_grouped.py.
#include "dg_fp4_bindings.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dg_fp4_grouped.h"

namespace py = pybind11;

namespace {

void w4a16_grouped(int tn, int warps, int rt, int stages, std::uintptr_t a, std::uintptr_t packed,
                   std::uintptr_t scales, std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g,
                   std::uintptr_t stream) {
  if (k <= 0 || k % 128 != 0) throw std::invalid_argument("k: expected a positive multiple of 128, got " +
                                                          std::to_string(k));
  if (m < 0 || n < 0 || g < 0) throw std::invalid_argument("m, n, g: expected >= 0");
  int err = 0;
  {
    py::gil_scoped_release release;
    err = dg_fp4::w4a16_grouped_launch(tn, warps, rt, stages, a, packed, scales, offs, out, m, n, k, g, stream);
  }
  if (err == -1) {
    throw std::invalid_argument("variant (tn, warps, rt, stages) = (" + std::to_string(tn) + ", " +
                                std::to_string(warps) + ", " + std::to_string(rt) + ", " + std::to_string(stages) +
                                "): not compiled (see fp4_w4a16_variants())");
  }
  if (err != 0) throw std::runtime_error("fp4_w4a16_grouped: " + dg_fp4::w4a16_error_string());
}

void w4a16_p_grouped(int kt, int tn, int warps, int rt, int stages, std::uintptr_t a, std::uintptr_t packed,
                     std::uintptr_t scales, std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g,
                     std::uintptr_t stream) {
  const std::string what = "fp4_w4a16_p_grouped (persistent)";
  if (k <= 0 || k % 128 != 0) throw std::invalid_argument("k: expected a positive multiple of 128, got " +
                                                          std::to_string(k));
  if (m < 0 || n < 0 || g < 0) throw std::invalid_argument("m, n, g: expected >= 0");
  int err = 0;
  {
    py::gil_scoped_release release;
    err = dg_fp4::w4a16_p_grouped_launch(kt, tn, warps, rt, stages, a, packed, scales, offs, out, m, n, k, g, stream);
  }
  if (err == -1) {
    throw std::invalid_argument(what + " variant (kt, tn, warps, rt, stages) = (" + std::to_string(kt) + ", " +
                                std::to_string(tn) + ", " + std::to_string(warps) + ", " + std::to_string(rt) + ", " +
                                std::to_string(stages) + "): not compiled");
  }
  if (err != 0) throw std::runtime_error(what + ": " + dg_fp4::w4a16_p_error_string());
}

std::vector<std::tuple<int, int, int, int, int>> p_variants() {
  std::vector<std::tuple<int, int, int, int, int>> out;
  for (const auto& v : dg_fp4::w4a16_p_variants()) out.emplace_back(v.kt, v.tn, v.warps, v.rt, v.stages);
  return out;
}

std::vector<std::tuple<int, int, int, int>> variants() {
  std::vector<std::tuple<int, int, int, int>> out;
  for (const auto& v : dg_fp4::w4a16_variants()) out.emplace_back(v.tn, v.warps, v.rt, v.stages);
  return out;
}

}  // namespace

void dg_register_fp4(pybind11::module_& m) {
  m.def("fp4_w4a16_variants", &variants, "Compiled W4A16 grouped variants: (tn, warps, rt, stages) tuples.");
  m.def("fp4_w4a16_smem_bytes", &dg_fp4::w4a16_smem_bytes, py::arg("tn"), py::arg("warps"), py::arg("rt"),
        py::arg("stages"), "Dynamic shared memory of a variant (-1: not compiled).");
  m.def("fp4_w4a16_grouped", &w4a16_grouped, py::arg("tn"), py::arg("warps"), py::arg("rt"), py::arg("stages"),
        py::arg("a"), py::arg("packed"), py::arg("scales"), py::arg("offs"), py::arg("out"), py::arg("m"),
        py::arg("n"), py::arg("k"), py::arg("g"), py::arg("stream"),
        "W4A16 M-grouped GEMM, swap-AB mma.sync kernel (csrc/cuda/dg_fp4_grouped.cuh).");
  m.def("fp4_w4a16_p_variants", &p_variants,
        "Compiled persistent W4A16 variants (kernel 5): (kt, tn, warps, rt, stages) tuples.");
  m.def("fp4_w4a16_p_smem_bytes", &dg_fp4::w4a16_p_smem_bytes, py::arg("kt"), py::arg("tn"), py::arg("warps"),
        py::arg("rt"), py::arg("stages"), py::arg("g"), "Dynamic shared memory of a persistent variant with g groups.");
  m.def("fp4_w4a16_p_grouped", &w4a16_p_grouped, py::arg("kt"), py::arg("tn"), py::arg("warps"), py::arg("rt"),
        py::arg("stages"), py::arg("a"), py::arg("packed"), py::arg("scales"), py::arg("offs"), py::arg("out"),
        py::arg("m"), py::arg("n"), py::arg("k"), py::arg("g"), py::arg("stream"),
        "W4A16 M-grouped GEMM, persistent swap-AB kernel (csrc/cuda/dg_fp4_persistent.cuh).");
}
