// pybind11 module deepinfer.deep_gemm._C (torch-free: tensors arrive as data_ptr() integers).
// The CUTLASS entry points exist only when CMake found the CUTLASS headers (DG_HAVE_CUTLASS); Python checks
// `_C.has_cutlass_fp8()` and falls back to Triton otherwise.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dg_fp4_bindings.h"
#include "dg_w4a8_bindings.h"
#include "dg_fp8_db_bindings.h"

#ifdef DG_HAVE_CUTLASS
#include "cutlass/dg_cutlass_fp8.h"
#include "cutlass/dg_cutlass_w4a16.h"
#endif

namespace py = pybind11;

#ifdef DG_HAVE_CUTLASS
namespace dg {

namespace {
struct ConfigEntry {
  int64_t (*workspace_size)(const CutlassFp8Args&);
  void (*run)(const CutlassFp8Args&);
};

// Index = config number (dg_cutlass_fp8.h).
const ConfigEntry kConfigs[kCutlassFp8Configs] = {
    {cutlass_fp8_workspace_size_coop, cutlass_fp8_gemm_coop},
    {cutlass_fp8_workspace_size_pingpong, cutlass_fp8_gemm_pingpong},
    {cutlass_fp8_workspace_size_coop_k, cutlass_fp8_gemm_coop_k},
    {cutlass_fp8_workspace_size_coop_k_2x1, cutlass_fp8_gemm_coop_k_2x1},
    {cutlass_fp8_workspace_size_pingpong_k, cutlass_fp8_gemm_pingpong_k},
    {cutlass_fp8_workspace_size_coop_k_2x2, cutlass_fp8_gemm_coop_k_2x2},
};

void check_range(const char* name, int value, int lo, int hi) {
  if (value < lo || value > hi) {
    throw std::invalid_argument(std::string(name) + ": expected " + std::to_string(lo) + ".." + std::to_string(hi) +
                                ", got " + std::to_string(value));
  }
}

void check_knobs(int config, const CutlassFp8Args& args) {
  check_range("config", config, 0, kCutlassFp8Configs - 1);
  check_range("raster", args.raster, 0, 2);
  check_range("decomposition", args.decomposition, 0, 3);
  check_range("splits", args.splits, 1, 64);
  if (args.swizzle != 1 && args.swizzle != 2 && args.swizzle != 4 && args.swizzle != 8) {
    throw std::invalid_argument("swizzle: expected 1, 2, 4 or 8, got " + std::to_string(args.swizzle));
  }
}
struct GroupedEntry {
  int64_t (*aux_bytes)(int);
  int64_t (*workspace_size)(int);
  void (*run)(const CutlassFp8GroupedArgs&);
};

// Index = grouped config number (dg_cutlass_fp8.h).
const GroupedEntry kGroupedConfigs[kCutlassFp8GroupedConfigs] = {
    {cutlass_fp8_grouped_aux_bytes_coop, cutlass_fp8_grouped_workspace_size_coop, cutlass_fp8_grouped_gemm_coop},
    {cutlass_fp8_grouped_aux_bytes_coop_2x1, cutlass_fp8_grouped_workspace_size_coop_2x1,
     cutlass_fp8_grouped_gemm_coop_2x1},
    {cutlass_fp8_grouped_aux_bytes_pingpong, cutlass_fp8_grouped_workspace_size_pingpong,
     cutlass_fp8_grouped_gemm_pingpong},
    {cutlass_fp8_grouped_aux_bytes_coop_1x1, cutlass_fp8_grouped_workspace_size_coop_1x1,
     cutlass_fp8_grouped_gemm_coop_1x1},
    {cutlass_fp8_grouped_aux_bytes_coop_2x2, cutlass_fp8_grouped_workspace_size_coop_2x2,
     cutlass_fp8_grouped_gemm_coop_2x2},
};

struct W4A16DqEntry {
  int64_t (*aux_bytes)(int);
  int64_t (*workspace_size)(int);
  void (*run)(const CutlassW4A16DqArgs&);
};

// Index = W4A16 dq config number (dg_cutlass_w4a16.h).
const W4A16DqEntry kW4A16DqConfigs[kCutlassW4A16DqConfigs] = {
    {cutlass_w4a16_dq_aux_bytes_coop, cutlass_w4a16_dq_workspace_size_coop, cutlass_w4a16_dq_gemm_coop},
    {cutlass_w4a16_dq_aux_bytes_pingpong, cutlass_w4a16_dq_workspace_size_pingpong,
     cutlass_w4a16_dq_gemm_pingpong},
};

void check_grouped(int config, int groups) {
  check_range("config", config, 0, kCutlassFp8GroupedConfigs - 1);
  check_range("groups", groups, 1, 1 << 20);
}
}  // namespace

int64_t cutlass_fp8_grouped_aux_bytes(int config, int groups) {
  check_grouped(config, groups);
  return kGroupedConfigs[config].aux_bytes(groups);
}

int64_t cutlass_fp8_grouped_workspace_size(int config, int groups) {
  check_grouped(config, groups);
  return kGroupedConfigs[config].workspace_size(groups);
}

void cutlass_fp8_grouped_gemm(const CutlassFp8GroupedArgs& args) {
  check_grouped(args.config, args.groups);
  check_range("raster", args.raster, 0, 2);
  if (args.swizzle != 1 && args.swizzle != 2 && args.swizzle != 4 && args.swizzle != 8) {
    throw std::invalid_argument("swizzle: expected 1, 2, 4 or 8, got " + std::to_string(args.swizzle));
  }
  kGroupedConfigs[args.config].run(args);
}

int64_t cutlass_w4a16_dq_aux_bytes(int config, int chunk) {
  check_range("config", config, 0, kCutlassW4A16DqConfigs - 1);
  check_range("chunk", chunk, 1, 65535);
  return kW4A16DqConfigs[config].aux_bytes(chunk);
}

int64_t cutlass_w4a16_dq_workspace_size(int config, int chunk) {
  check_range("config", config, 0, kCutlassW4A16DqConfigs - 1);
  check_range("chunk", chunk, 1, 65535);
  return kW4A16DqConfigs[config].workspace_size(chunk);
}

void cutlass_w4a16_dq_gemm(const CutlassW4A16DqArgs& args) {
  check_range("config", args.config, 0, kCutlassW4A16DqConfigs - 1);
  check_range("groups", args.groups, 1, 1 << 20);
  check_range("chunk", args.chunk, 1, 65535);  // gridDim.y of the dequantiser
  check_range("raster", args.raster, 0, 2);
  if (args.k % 128 != 0 || args.n % 16 != 0 || args.m < 0) {
    throw std::invalid_argument("m, n, k: expected m >= 0, n % 16 == 0, k % 128 == 0, got " + std::to_string(args.m) +
                                ", " + std::to_string(args.n) + ", " + std::to_string(args.k));
  }
  if (args.swizzle != 1 && args.swizzle != 2 && args.swizzle != 4 && args.swizzle != 8) {
    throw std::invalid_argument("swizzle: expected 1, 2, 4 or 8, got " + std::to_string(args.swizzle));
  }
  kW4A16DqConfigs[args.config].run(args);
}

int64_t cutlass_fp8_workspace_size(int config, const CutlassFp8Args& args) {
  check_knobs(config, args);
  return kConfigs[config].workspace_size(args);
}

void cutlass_fp8_gemm(int config, const CutlassFp8Args& args) {
  check_knobs(config, args);
  kConfigs[config].run(args);
}

}  // namespace dg
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "deep_gemm compiled kernels (CUTLASS SM90 FP8 block-scaled GEMM when built with CUTLASS)";
  dg_register_fp4(m);  // the FP4-expert kernels (dg_fp4_*), bound in their own file, independent of CUTLASS
  dg_register_w4a8(m);  // the W4A8 FP8-wgmma kernel (dg_w4a8_*), bound in its own file
#ifdef DG_HAVE_CUTLASS
  m.def("has_cutlass_fp8", []() { return true; });
  m.attr("cutlass_fp8_configs") = dg::kCutlassFp8Configs;
  m.def(
      "cutlass_fp8_workspace_size",
      [](int config, int m_, int n, int k, int raster, int swizzle, int decomposition, int splits) {
        dg::CutlassFp8Args args{};
        args.m = m_;
        args.n = n;
        args.k = k;
        args.raster = raster;
        args.swizzle = swizzle;
        args.decomposition = decomposition;
        args.splits = splits;
        return dg::cutlass_fp8_workspace_size(config, args);
      },
      py::arg("config"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("raster") = 0, py::arg("swizzle") = 1,
      py::arg("decomposition") = 0, py::arg("splits") = 1,
      "Bytes of device workspace the CUTLASS FP8 GEMM config needs for (m, n, k) and the scheduler knobs.");
  m.def(
      "cutlass_fp8_gemm",
      [](int config, uintptr_t a, uintptr_t sfa, uintptr_t b, uintptr_t sfb, uintptr_t c, uintptr_t d, int m_,
         int n, int k, int sfa_ld, float beta, uintptr_t workspace, uintptr_t stream, int raster, int swizzle,
         int decomposition, int splits) {
        dg::CutlassFp8Args args{a, sfa, b, sfb, c, d, m_, n, k, sfa_ld, beta, workspace, stream};
        args.raster = raster;
        args.swizzle = swizzle;
        args.decomposition = decomposition;
        args.splits = splits;
        py::gil_scoped_release release;  // host-side work (TMA descriptors) needs no Python state
        dg::cutlass_fp8_gemm(config, args);
      },
      py::arg("config"), py::arg("a"), py::arg("sfa"), py::arg("b"), py::arg("sfb"), py::arg("c"), py::arg("d"),
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("sfa_ld"), py::arg("beta"), py::arg("workspace"),
      py::arg("stream"), py::arg("raster") = 0, py::arg("swizzle") = 1, py::arg("decomposition") = 0,
      py::arg("splits") = 1,
      "D = beta*C + blockscaled(A) @ blockscaled(B)^T (see csrc/cuda/cutlass/dg_cutlass_fp8.h for layouts).");
  m.def("has_cutlass_fp8_grouped", []() { return true; });
  m.attr("cutlass_fp8_grouped_configs") = dg::kCutlassFp8GroupedConfigs;
  m.def("cutlass_fp8_grouped_aux_bytes", &dg::cutlass_fp8_grouped_aux_bytes, py::arg("config"), py::arg("groups"),
        "Bytes of the per-expert device arrays of the grouped FP8 GEMM.");
  m.def("cutlass_fp8_grouped_workspace_size", &dg::cutlass_fp8_grouped_workspace_size, py::arg("config"),
        py::arg("groups"), "Bytes of CUTLASS workspace of the grouped FP8 GEMM.");
  m.def(
      "cutlass_fp8_grouped_gemm",
      [](uintptr_t a, uintptr_t sfa, uintptr_t b, uintptr_t sfb, uintptr_t d, uintptr_t m_indices, int rows, int n,
         int k, int groups, uintptr_t aux, uintptr_t workspace, uintptr_t stream, int masked, int m_max, int config,
         int raster, int swizzle) {
        dg::CutlassFp8GroupedArgs args{a, sfa, b, sfb, d, m_indices, rows, n, k, groups, aux, workspace, stream};
        args.masked = masked;
        args.m_max = m_max;
        args.config = config;
        args.raster = raster;
        args.swizzle = swizzle;
        py::gil_scoped_release release;
        dg::cutlass_fp8_grouped_gemm(args);
      },
      py::arg("a"), py::arg("sfa"), py::arg("b"), py::arg("sfb"), py::arg("d"), py::arg("m_indices"),
      py::arg("rows"), py::arg("n"), py::arg("k"), py::arg("groups"), py::arg("aux"), py::arg("workspace"),
      py::arg("stream"), py::arg("masked") = 0, py::arg("m_max") = 0, py::arg("config") = 0, py::arg("raster") = 0,
      py::arg("swizzle") = 1,
      "M-grouped FP8 GEMM, contiguous (masked=0, m_indices = row ids) or masked (masked=1, m_indices = masked_m) "
      "layout (see csrc/cuda/cutlass/dg_cutlass_fp8.h).");
  m.def("has_cutlass_w4a16_dq", []() { return true; });
  m.attr("cutlass_w4a16_dq_configs") = dg::kCutlassW4A16DqConfigs;
  m.def("cutlass_w4a16_dq_aux_bytes", &dg::cutlass_w4a16_dq_aux_bytes, py::arg("config"), py::arg("chunk"),
        "Bytes of the per-expert device arrays of one chunk of the W4A16 dequantise-then-grouped-bf16 GEMM.");
  m.def("cutlass_w4a16_dq_workspace_size", &dg::cutlass_w4a16_dq_workspace_size, py::arg("config"),
        py::arg("chunk"), "Bytes of CUTLASS workspace of the W4A16 dequantise-then-grouped-bf16 GEMM.");
  m.def(
      "cutlass_w4a16_dq_gemm",
      [](uintptr_t a, uintptr_t packed, uintptr_t scales, uintptr_t offs, uintptr_t d, int m_, int n, int k,
         int groups, int chunk, uintptr_t scratch, uintptr_t aux, uintptr_t workspace, uintptr_t stream, int config,
         int raster, int swizzle) {
        dg::CutlassW4A16DqArgs args{a, packed, scales, offs, d, m_, n, k, groups, chunk, scratch, aux, workspace,
                                    stream};
        args.config = config;
        args.raster = raster;
        args.swizzle = swizzle;
        py::gil_scoped_release release;
        dg::cutlass_w4a16_dq_gemm(args);
      },
      py::arg("a"), py::arg("packed"), py::arg("scales"), py::arg("offs"), py::arg("d"), py::arg("m"), py::arg("n"),
      py::arg("k"), py::arg("groups"), py::arg("chunk"), py::arg("scratch"), py::arg("aux"), py::arg("workspace"),
      py::arg("stream"), py::arg("config") = 0, py::arg("raster") = 0, py::arg("swizzle") = 1,
      "W4A16 grouped GEMM: per chunk of experts, dequantise to bf16 scratch, then CUTLASS grouped bf16 GEMM (see "
      "csrc/cuda/cutlass/dg_cutlass_w4a16.h).");
#else
  m.def("has_cutlass_fp8", []() { return false; });
  m.def("has_cutlass_fp8_grouped", []() { return false; });
  m.def("has_cutlass_w4a16_dq", []() { return false; });
#endif
  dg_register_fp8_db(m);  // the FP8 double-buffered-promotion kernel (dg_fp8_db_*), bound in its own file
}
