// Launchers of the W4A16 grouped GEMM variants (kernel and design notes: dg_fp4_grouped.cuh).
#include "dg_fp4_grouped.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "dg_fp4_grouped.cuh"

namespace dg_fp4 {
namespace {

constexpr int kMaxDevices = 64;
std::string g_last_error;

// Raises the dynamic shared memory limit of one instantiation, once per device, so launches under CUDA-graph
// capture only launch.
template <int TN, int WARPS, int RT, int NS>
cudaError_t opt_in_smem() {
  static bool configured[kMaxDevices] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 0 && dev < kMaxDevices && configured[dev]) return cudaSuccess;
  err = cudaFuncSetAttribute(fp4_w4a16_grouped_kernel<TN, WARPS, RT, NS>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, Fp4Cfg<TN, WARPS, RT, NS>::kSmemBytes);
  if (err == cudaSuccess && dev >= 0 && dev < kMaxDevices) configured[dev] = true;
  return err;
}

template <int TN, int WARPS, int RT, int NS>
int launch(const Fp4Args& p, cudaStream_t stream) {
  using C = Fp4Cfg<TN, WARPS, RT, NS>;
  cudaError_t err = opt_in_smem<TN, WARPS, RT, NS>();
  if (err == cudaSuccess) {
    const dim3 grid((p.n + C::kRows - 1) / C::kRows, p.g);
    fp4_w4a16_grouped_kernel<TN, WARPS, RT, NS><<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "fp4 w4a16 tn=%d warps=%d rt=%d stages=%d smem=%d: %s", TN, WARPS, RT, NS,
                  C::kSmemBytes, cudaGetErrorString(err));
    g_last_error = buf;
  }
  return static_cast<int>(err);
}

struct Entry {
  W4A16Variant v;
  int smem;
  int (*run)(const Fp4Args&, cudaStream_t);
};

#define DG_FP4_VARIANT(TN, W, RT, NS) \
  Entry { {TN, W, RT, NS}, Fp4Cfg<TN, W, RT, NS>::kSmemBytes, &launch<TN, W, RT, NS> }

// Keep in sync with W4A16_CUDA_VARIANTS in backends/cuda/w4a16_configs.py (a test compares them when _C exists).
const Entry kEntries[] = {
    DG_FP4_VARIANT(8, 4, 2, 4),   // 128 rows per CTA
#ifndef DG_FP4_ONLY_FIRST         // (the quick compile check of the CPU tests builds the first variant only)
    DG_FP4_VARIANT(8, 4, 1, 4),   // 64 rows: twice the CTAs, 3 CTAs per SM
    DG_FP4_VARIANT(8, 8, 1, 4),   // 128 rows, 8 warps
    DG_FP4_VARIANT(8, 4, 2, 6),   // deeper pipeline
    DG_FP4_VARIANT(16, 4, 2, 4),  //
    DG_FP4_VARIANT(16, 4, 1, 4),  //
    DG_FP4_VARIANT(16, 8, 1, 4),  // 128 registers: 2 CTAs = 16 warps per SM
    DG_FP4_VARIANT(32, 4, 2, 3),  //
    DG_FP4_VARIANT(32, 8, 1, 3),  //
    DG_FP4_VARIANT(64, 4, 2, 3),  //
    DG_FP4_VARIANT(64, 8, 1, 3),  //
#endif
};

const Entry* find(int tn, int warps, int rt, int stages) {
  for (const Entry& e : kEntries) {
    if (e.v.tn == tn && e.v.warps == warps && e.v.rt == rt && e.v.stages == stages) return &e;
  }
  return nullptr;
}

}  // namespace

const std::vector<W4A16Variant>& w4a16_variants() {
  static const std::vector<W4A16Variant> all = [] {
    std::vector<W4A16Variant> v;
    for (const Entry& e : kEntries) v.push_back(e.v);
    return v;
  }();
  return all;
}

int w4a16_smem_bytes(int tn, int warps, int rt, int stages) {
  const Entry* e = find(tn, warps, rt, stages);
  return e == nullptr ? -1 : e->smem;
}

int w4a16_grouped_launch(int tn, int warps, int rt, int stages, std::uintptr_t a, std::uintptr_t packed,
                         std::uintptr_t scales, std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g,
                         std::uintptr_t stream) {
  const Entry* e = find(tn, warps, rt, stages);
  if (e == nullptr) {
    g_last_error = "unknown variant";
    return -1;
  }
  if (m == 0 || n == 0 || g == 0) return 0;
  Fp4Args p{reinterpret_cast<const __nv_bfloat16*>(a), reinterpret_cast<const uint8_t*>(packed),
            reinterpret_cast<const uint8_t*>(scales), reinterpret_cast<const int*>(offs),
            reinterpret_cast<__nv_bfloat16*>(out), m, n, k, g, 1u << 26};
  return e->run(p, reinterpret_cast<cudaStream_t>(stream));
}

std::string w4a16_error_string() { return g_last_error; }

}  // namespace dg_fp4
