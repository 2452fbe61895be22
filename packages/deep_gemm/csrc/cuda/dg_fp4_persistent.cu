// Launchers of the persistent W4A16 grouped GEMM variants ("kernel 5"; kernel and design notes:
// dg_fp4_persistent.cuh). The W4A16 API runs kernel 5 by default up to 16 rows per group (w4a16_configs.CUDA_P_BY_TN).
#include <cuda_runtime.h>

#include <cstdio>

#include "dg_fp4_grouped.h"
#include "dg_fp4_persistent.cuh"

namespace dg_fp4 {
namespace {

constexpr int kMaxDevices = 64;
std::string g_last_error;

int device_sms(int dev) {
  static int sms[kMaxDevices] = {};
  if (dev < 0 || dev >= kMaxDevices) return 0;
  if (sms[dev] == 0) cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev);
  return sms[dev];
}

// The kernel of a variant.
template <int KT, int TN, int WARPS, int RT, int NS>
inline void (*p_kernel())(const Fp4Args) {
  return fp4_w4a16_persistent_kernel<KT, TN, WARPS, RT, NS>;
}

// Raises the instantiation's dynamic shared memory limit to the device's opt-in maximum, once per device (the
// launch size depends on g), so launches under CUDA-graph capture only query occupancy and launch.
template <int KT, int TN, int WARPS, int RT, int NS>
cudaError_t p_opt_in_smem(int dev) {
  static bool configured[kMaxDevices] = {};
  if (dev >= 0 && dev < kMaxDevices && configured[dev]) return cudaSuccess;
  int optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(p_kernel<KT, TN, WARPS, RT, NS>(), cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  if (err == cudaSuccess && dev >= 0 && dev < kMaxDevices) configured[dev] = true;
  return err;
}

// CTAs per SM of an instantiation at `smem` bytes, cached per device for the last size asked (a captured launch
// after an uncaptured warm-up with the same g makes no runtime API call but the launch).
template <int KT, int TN, int WARPS, int RT, int NS>
cudaError_t p_blocks_per_sm(int dev, int smem, int* per_sm) {
  static int last_smem[kMaxDevices] = {}, last_blocks[kMaxDevices] = {};
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable && last_smem[dev] == smem && last_blocks[dev] > 0) {
    *per_sm = last_blocks[dev];
    return cudaSuccess;
  }
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      per_sm, p_kernel<KT, TN, WARPS, RT, NS>(), PCfg<KT, TN, WARPS, RT, NS>::kThreads, smem);
  if (err == cudaSuccess && cacheable) {
    last_smem[dev] = smem;
    last_blocks[dev] = *per_sm;
  }
  return err;
}

template <int KT, int TN, int WARPS, int RT, int NS>
int p_launch(const Fp4Args& p, cudaStream_t stream) {
  using C = PCfg<KT, TN, WARPS, RT, NS>;
  const int smem = C::kSmemBytes + p_extra_bytes(p.g);
  int dev = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = p_opt_in_smem<KT, TN, WARPS, RT, NS>(dev);
  if (err == cudaSuccess) err = p_blocks_per_sm<KT, TN, WARPS, RT, NS>(dev, smem, &per_sm);
  if (err == cudaSuccess && per_sm < 1) err = cudaErrorInvalidConfiguration;  // g too large for shared memory
  if (err == cudaSuccess) {
    // work items (expert, slab): at most g per slab
    const long long slabs = (p.n + C::kRows - 1) / C::kRows;
    const long long items = static_cast<long long>(p.g) * slabs;
    const long long full = static_cast<long long>(per_sm) * device_sms(dev);
    const int grid = static_cast<int>(items < full ? items : full);
    p_kernel<KT, TN, WARPS, RT, NS>()<<<grid, C::kThreads, smem, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "fp4 w4a16 persistent kt=%d tn=%d warps=%d rt=%d stages=%d smem=%d g=%d: %s", KT,
                  TN, WARPS, RT, NS, smem, p.g, cudaGetErrorString(err));
    g_last_error = buf;
  }
  return static_cast<int>(err);
}

struct PEntry {
  W4A16PVariant v;
  int smem;
  int (*run)(const Fp4Args&, cudaStream_t);
};

#define DG_FP4_PVARIANT(KT, TN, W, RT, NS) \
  PEntry { {KT, TN, W, RT, NS}, PCfg<KT, TN, W, RT, NS>::kSmemBytes, &p_launch<KT, TN, W, RT, NS> }

// Keep in sync with CUDA_P_VARIANTS in backends/cuda/w4a16_configs.py and the emulator driver (tests compare them).
const PEntry kPEntries[] = {
    // CTAs per SM on an H200 from the sm_90a build (registers, then shared memory with g = 256 experts):
    DG_FP4_PVARIANT(256, 8, 4, 1, 4),   // kernel 4's default tile (m8n64k256w4s4cu): 127 regs, 54 KB -> 4 CTAs
#ifndef DG_FP4_ONLY_FIRST               // (the quick compile check of the CPU tests builds the first variant only)
    DG_FP4_PVARIANT(512, 8, 4, 1, 2),   // 512-k stages, one in flight: 127 regs, 54 KB -> 4
    DG_FP4_PVARIANT(512, 8, 8, 1, 2),   // 128 rows, 8 warps: activations per weight byte halved; 88 KB -> 2 x 8 warps
    DG_FP4_PVARIANT(256, 8, 4, 2, 3),   // 128 rows, activations paired once for both row tiles: 167 regs -> 3
    DG_FP4_PVARIANT(512, 8, 4, 2, 2),   // the same with 512-k stages: 239 regs -> 2 (8 warps per SM)
    DG_FP4_PVARIANT(256, 8, 4, 1, 3),   // one stage less than the first (41 KB; still 4 CTAs: registers)
    // Session 6: the default's 128-row tile with 256-k stages in the default's shared memory (85 KB -> 2 CTAs):
    // three 16 KB weight stages in flight per CTA instead of one 32 KB stage. 207 regs.
    DG_FP4_PVARIANT(256, 8, 4, 2, 4),
    DG_FP4_PVARIANT(256, 16, 4, 1, 4),  // 16-token blocks: 159 regs -> 3
    DG_FP4_PVARIANT(512, 16, 4, 1, 2),  // 167 regs -> 3
    // More tokens per block for ~64 rows per expert (session 5 stretch; benchmark rows only, no default uses them):
    // fewer passes over each expert's weights (64 tokens: one) at more MMAs per weight byte.
    DG_FP4_PVARIANT(256, 32, 4, 1, 4),  // 167 regs, 100 KB -> 2 CTAs (shared memory)
    DG_FP4_PVARIANT(256, 32, 4, 2, 3),  // 128 rows: 249 regs, 101 KB -> 2
    DG_FP4_PVARIANT(512, 32, 8, 1, 2),  // 128 rows, 8 warps: 201 regs, 133 KB -> 1 x 8 warps
    DG_FP4_PVARIANT(256, 64, 8, 1, 3),  // one token block at 64 per expert: 209 regs, 150 KB -> 1 x 8 warps
#endif
};

const PEntry* p_find(int kt, int tn, int warps, int rt, int stages) {
  for (const PEntry& e : kPEntries) {
    if (e.v.kt == kt && e.v.tn == tn && e.v.warps == warps && e.v.rt == rt && e.v.stages == stages) return &e;
  }
  return nullptr;
}

int run_entry(const PEntry* e, std::uintptr_t a, std::uintptr_t packed, std::uintptr_t scales, std::uintptr_t offs,
              std::uintptr_t out, int m, int n, int k, int g, std::uintptr_t stream) {
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

}  // namespace

const std::vector<W4A16PVariant>& w4a16_p_variants() {
  static const std::vector<W4A16PVariant> all = [] {
    std::vector<W4A16PVariant> v;
    for (const PEntry& e : kPEntries) v.push_back(e.v);
    return v;
  }();
  return all;
}

int w4a16_p_smem_bytes(int kt, int tn, int warps, int rt, int stages, int g) {
  const PEntry* e = p_find(kt, tn, warps, rt, stages);
  return e == nullptr ? -1 : e->smem + p_extra_bytes(g);
}

int w4a16_p_grouped_launch(int kt, int tn, int warps, int rt, int stages, std::uintptr_t a, std::uintptr_t packed,
                           std::uintptr_t scales, std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g,
                           std::uintptr_t stream) {
  return run_entry(p_find(kt, tn, warps, rt, stages), a, packed, scales, offs, out, m, n, k, g, stream);
}

std::string w4a16_p_error_string() { return g_last_error; }

}  // namespace dg_fp4
