// pybind11 module deepinfer.deep_gemm._C (torch-free: tensors arrive as data_ptr() integers).
// The CUTLASS entry points exist only when CMake found the CUTLASS headers (DG_HAVE_CUTLASS); Python checks
// `_C.has_cutlass_fp8()` and falls back to Triton otherwise.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#ifdef DG_HAVE_CUTLASS
#include "cutlass/dg_cutlass_fp8.h"
#endif

namespace py = pybind11;

#ifdef DG_HAVE_CUTLASS
namespace dg {

static void check_config(int config) {
  if (config < 0 || config >= kCutlassFp8Configs) {
    throw std::invalid_argument("config: expected 0.." + std::to_string(kCutlassFp8Configs - 1) + ", got " +
                                std::to_string(config));
  }
}

int64_t cutlass_fp8_workspace_size(int config, int m, int n, int k) {
  check_config(config);
  return config == 0 ? cutlass_fp8_workspace_size_coop(m, n, k) : cutlass_fp8_workspace_size_pingpong(m, n, k);
}

void cutlass_fp8_gemm(int config, const CutlassFp8Args& args) {
  check_config(config);
  if (config == 0) {
    cutlass_fp8_gemm_coop(args);
  } else {
    cutlass_fp8_gemm_pingpong(args);
  }
}

}  // namespace dg
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "deep_gemm compiled kernels (CUTLASS SM90 FP8 block-scaled GEMM when built with CUTLASS)";
#ifdef DG_HAVE_CUTLASS
  m.def("has_cutlass_fp8", []() { return true; });
  m.attr("cutlass_fp8_configs") = dg::kCutlassFp8Configs;
  m.def("cutlass_fp8_workspace_size", &dg::cutlass_fp8_workspace_size, py::arg("config"), py::arg("m"),
        py::arg("n"), py::arg("k"), "Bytes of device workspace the CUTLASS FP8 GEMM config needs for (m, n, k).");
  m.def(
      "cutlass_fp8_gemm",
      [](int config, uintptr_t a, uintptr_t sfa, uintptr_t b, uintptr_t sfb, uintptr_t c, uintptr_t d, int m_,
         int n, int k, int sfa_ld, float beta, uintptr_t workspace, uintptr_t stream) {
        dg::CutlassFp8Args args{a, sfa, b, sfb, c, d, m_, n, k, sfa_ld, beta, workspace, stream};
        py::gil_scoped_release release;  // host-side work (TMA descriptors) needs no Python state
        dg::cutlass_fp8_gemm(config, args);
      },
      py::arg("config"), py::arg("a"), py::arg("sfa"), py::arg("b"), py::arg("sfb"), py::arg("c"), py::arg("d"),
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("sfa_ld"), py::arg("beta"), py::arg("workspace"),
      py::arg("stream"),
      "D = beta*C + blockscaled(A) @ blockscaled(B)^T (see csrc/cuda/cutlass/dg_cutlass_fp8.h for layouts).");
#else
  m.def("has_cutlass_fp8", []() { return false; });
#endif
}
