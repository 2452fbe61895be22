// Entry points of the W4A8 FP8-wgmma grouped GEMM (dg_w4a8_grouped.cu), added to deepinfer.deep_gemm._C by
// dg_module.cpp. Tensors arrive as data_ptr() integers; the Python wrapper is backends/cuda/cuda_w4a8_grouped.py.
#include "dg_w4a8_bindings.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dg_w4a8_grouped.h"
#include "dg_w4a8_rs_ablate.h"

namespace py = pybind11;

namespace {

void w4a8_grouped(int wg, int stages, int rel, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t packed,
                  std::uintptr_t scales, std::uintptr_t offs, std::uintptr_t out, std::uintptr_t sref, int m, int n,
                  int k, int g, int ctas, std::uintptr_t stream) {
  int err = 0;
  {
    py::gil_scoped_release release;
    err = dg_w4a8::w4a8_grouped_launch(wg, stages, rel, a, sfa, packed, scales, offs, out, sref, m, n, k, g, ctas,
                                       stream);
  }
  if (err == -1) {
    throw std::invalid_argument("variant (wg, stages, rel) = (" + std::to_string(wg) + ", " + std::to_string(stages) +
                                ", " + std::to_string(rel) + "): not compiled (see w4a8_cuda_variants())");
  }
  if (err == -2) throw std::invalid_argument(dg_w4a8::w4a8_error_string());
  if (err != 0) throw std::runtime_error("w4a8_cuda_grouped: " + dg_w4a8::w4a8_error_string());
}

// DIAGNOSTIC: cuda_rs2s4n256 with consumer work removed (dg_w4a8_rs_ablate.h; wrong results, timing only).
void w4a8_rs_ablate(int mask, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t packed, std::uintptr_t scales,
                    std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g, int ctas,
                    std::uintptr_t stream) {
  int err = 0;
  std::string msg;
  {
    py::gil_scoped_release release;
    err = dg_w4a8::w4a8_rs_ablate_launch(mask, a, sfa, packed, scales, offs, out, m, n, k, g, ctas, stream, &msg);
  }
  if (err == -1) throw std::invalid_argument("w4a8_rs_ablate: mask " + std::to_string(mask) + " not compiled");
  if (err == -2) throw std::invalid_argument(msg);
  if (err != 0) throw std::runtime_error("w4a8_rs_ablate: " + msg);
}

std::vector<std::tuple<int, int, int>> variants() {
  std::vector<std::tuple<int, int, int>> out;
  for (const auto& v : dg_w4a8::w4a8_variants()) out.emplace_back(v.wg, v.stages, v.rel);
  return out;
}

}  // namespace

void dg_register_w4a8(pybind11::module_& m) {
  m.def("w4a8_cuda_variants", &variants, "Compiled W4A8 FP8-wgmma variants: (wg, stages, rel) tuples (rel 2: warp-specialised).");
  m.def("w4a8_cuda_smem_bytes", &dg_w4a8::w4a8_smem_bytes, py::arg("wg"), py::arg("stages"), py::arg("rel"),
        py::arg("g"), "Dynamic shared memory of a variant with g groups (-1: not compiled).");
  m.def("w4a8_rs_ablate_masks", &dg_w4a8::w4a8_rs_ablate_masks,
        "DIAGNOSTIC: the compiled ablation masks of the rs n256 kernel (timing only, wrong results).");
  m.def("w4a8_rs_ablate", &w4a8_rs_ablate, py::arg("mask"), py::arg("a"), py::arg("sfa"), py::arg("packed"),
        py::arg("scales"), py::arg("offs"), py::arg("out"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("g"),
        py::arg("ctas"), py::arg("stream"),
        "DIAGNOSTIC: cuda_rs2s4n256 with one part of the consumers' work removed (dg_w4a8_rs_ablate.h).");
  m.def("w4a8_cuda_grouped", &w4a8_grouped, py::arg("wg"), py::arg("stages"), py::arg("rel"), py::arg("a"),
        py::arg("sfa"), py::arg("packed"), py::arg("scales"), py::arg("offs"), py::arg("out"), py::arg("sref"),
        py::arg("m"), py::arg("n"), py::arg("k"), py::arg("g"), py::arg("ctas"), py::arg("stream"),
        "W4A8 M-grouped GEMM on FP8 wgmma (csrc/cuda/dg_w4a8_grouped.cuh).");
}
