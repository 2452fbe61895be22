// Entry points of the FP8 block-scaled grouped GEMM with double-buffered promotion (dg_fp8_db.cu), added to
// deepinfer.deep_gemm._C by dg_module.cpp. Tensors arrive as data_ptr() integers; the Python wrapper is
// backends/cuda/cuda_fp8_db.py.
#include "dg_fp8_db_bindings.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dg_fp8_db.h"

namespace py = pybind11;

namespace {

void fp8_db_grouped(int stages, int stagger, int tma, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t b,
                    std::uintptr_t sfb, std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g, int ctas,
                    std::uintptr_t stream) {
  int err = 0;
  std::string msg;
  {
    py::gil_scoped_release release;
    err = dg_fp8db::fp8_db_launch(stages, stagger, tma, a, sfa, b, sfb, offs, out, m, n, k, g, ctas, stream, &msg);
  }
  if (err == -1) {
    throw std::invalid_argument("(stages, stagger, tma): expected one of fp8_db_variants(), got (" +
                                std::to_string(stages) + ", " + std::to_string(stagger) + ", " + std::to_string(tma) +
                                ") (not compiled)");
  }
  if (err == -2) throw std::invalid_argument(msg);
  if (err != 0) throw std::runtime_error("fp8_db_grouped: " + msg);
}

}  // namespace

void dg_register_fp8_db(pybind11::module_& m) {
  m.def("fp8_db_variants", &dg_fp8db::fp8_db_variants,
        "(stages, stagger, tma) triples the FP8 double-buffered-promotion GEMM was built with.");
  m.def("fp8_db_smem_bytes", &dg_fp8db::fp8_db_smem_bytes, py::arg("stages"), py::arg("g"), py::arg("tma") = 0,
        "Dynamic shared memory of the fp8_db kernel with `stages` ring stages and g groups; tma=2: the 128 x 256 "
        "tile kernel's (-1: not compiled).");
  m.def("fp8_db_grouped", &fp8_db_grouped, py::arg("stages"), py::arg("stagger"), py::arg("tma"), py::arg("a"),
        py::arg("sfa"), py::arg("b"), py::arg("sfb"), py::arg("offs"), py::arg("out"), py::arg("m"), py::arg("n"),
        py::arg("k"), py::arg("g"), py::arg("ctas"), py::arg("stream"),
        "FP8 block-scaled M-grouped GEMM (contiguous offs layout), double-buffered promotion; tma=1: the TMA "
        "producer; tma=2: 128 x 256 tiles with the TMA producer, n % 256 == 0 (csrc/cuda/dg_fp8_tma.cuh); tma=4: the "
        "W4A8 wide kernel, b = prepared FP4 chunks, sfb = their block scales (csrc/cuda/dg_w4a8_wide.cuh).");
}
