// pybind11 module deepinfer.deep_select._C: thin wrappers over the CUDA launchers (ints in, ints out, no torch).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "topk_radix.cuh"

namespace py = pybind11;

namespace {

void topk_radix(std::uintptr_t scores, int dtype, std::int64_t b, std::int64_t n, std::int64_t stride_b,
                std::uintptr_t lengths, std::uintptr_t starts, std::uintptr_t out, std::int64_t k,
                std::int64_t stride_ob, std::int64_t stride_ok, int cap, bool vec, int mode, int segs,
                std::uintptr_t gather, std::int64_t gather_m, std::uintptr_t stream) {
  if (cap < 1) throw std::invalid_argument("topk_radix: cap must be >= 1, got " + std::to_string(cap));
  if (segs < 1) throw std::invalid_argument("topk_radix: segs must be >= 1, got " + std::to_string(segs));
  if (k < 1) throw std::invalid_argument("topk_radix: k must be >= 1, got " + std::to_string(k));
  if (n >= (std::int64_t{1} << 31)) throw std::invalid_argument("topk_radix: n must be < 2^31");
  const int err = deep_select::topk_radix_launch(scores, dtype, b, n, stride_b, lengths, starts, out, k, stride_ob,
                                                 stride_ok, cap, vec, mode, segs, gather, gather_m, stream);
  if (err != 0) {
    throw std::runtime_error("topk_radix: CUDA launch failed with cudaError_t " + std::to_string(err) + ": " +
                             deep_select::topk_radix_error_string());
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "deep_select compiled kernels (CUDA C++ radix top-k)";
  m.def("topk_radix", &topk_radix, py::arg("scores"), py::arg("dtype"), py::arg("b"), py::arg("n"),
        py::arg("stride_b"), py::arg("lengths"), py::arg("starts"), py::arg("out"), py::arg("k"),
        py::arg("stride_ob"), py::arg("stride_ok"), py::arg("cap"), py::arg("vec"), py::arg("mode"),
        py::arg("segs"), py::arg("gather"), py::arg("gather_m"),
        py::arg("stream"));
  m.def("topk_radix_smem_bytes", &deep_select::topk_radix_smem_bytes, py::arg("cap"));
  m.attr("DTYPE_FLOAT32") = static_cast<int>(deep_select::kFloat32);
  m.attr("DTYPE_BFLOAT16") = static_cast<int>(deep_select::kBFloat16);
  m.attr("DTYPE_FLOAT16") = static_cast<int>(deep_select::kFloat16);
  m.attr("THREADS") = 512;
  m.attr("MODE_TWO_PASS") = 0;
  m.attr("MODE_ONE_READ") = 1;
  m.attr("MODE_FAST") = 2;
  m.attr("MODE_LEAN") = 3;
  m.attr("MODE_LEAN_PF") = 4;
}
