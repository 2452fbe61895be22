// Launchers of the DIAGNOSTIC rs ablation builds (dg_w4a8_rs_ablate.h; kernel: dg_w4a8_rs.cuh, kAblate). Own file so
// dg_w4a8_rs.cu (the user variants) compiles to the same code as before.
#include "dg_w4a8_rs_ablate.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "dg_launch.h"
#include "dg_w4a8_rs.cuh"

namespace dg_w4a8 {
namespace {

constexpr int kNS = 4, kTokA = 256;  // cuda_rs2s4n256
using LA = RsLayout<kNS, kTokA>;


template <int MASK>
int abl_launch(const Params& p, int ctas, cudaStream_t stream, std::string* msg) {
  int sms = 0;
  const int smem = LA::bytes(p.g);
  cudaError_t err = dg_launch::opt_in_smem_once<w4a8_rs_kernel<kNS, kTokA, MASK>>(LA::bytes(kMaxGroups), &sms);
  if (err == cudaSuccess) {
    if (ctas <= 0) ctas = sms;
    w4a8_rs_kernel<kNS, kTokA, MASK><<<ctas, LA::kThreads, smem, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess && msg != nullptr) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "w4a8 rs ablation mask=%d smem=%d ctas=%d: %s", MASK, smem, ctas,
                  cudaGetErrorString(err));
    *msg = buf;
  }
  return static_cast<int>(err);
}

}  // namespace

std::vector<int> w4a8_rs_ablate_masks() {
  return {kAblNoConv, kAblNoPromo, kAblNoMma, kAblProdOnly, kAblNoConv | kAblNoPromo, kAblNoStore, kAblNoFfma};
}

int w4a8_rs_ablate_launch(int mask, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t packed, std::uintptr_t scales,
                          std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g, int ctas,
                          std::uintptr_t stream, std::string* msg) {
  if (m < 0 || n <= 0 || n % 16 != 0 || k <= 0 || k % kBK != 0 || g < 1 || g > kMaxGroups) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "w4a8 rs ablation: bad sizes m=%d n=%d k=%d g=%d (k %% 128, n %% 16, 1 <= g <= %d)",
                  m, n, k, g, kMaxGroups);
    if (msg != nullptr) *msg = buf;
    return -2;
  }
  if (m == 0) return 0;
  Params p{reinterpret_cast<const uint8_t*>(a),      reinterpret_cast<const float*>(sfa),
           reinterpret_cast<const uint8_t*>(packed), reinterpret_cast<const uint8_t*>(scales),
           reinterpret_cast<const int*>(offs),       reinterpret_cast<__nv_bfloat16_raw*>(out),
           nullptr,                                  m, n, k, g};
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  switch (mask) {
    case kAblNoConv: return abl_launch<kAblNoConv>(p, ctas, s, msg);
    case kAblNoPromo: return abl_launch<kAblNoPromo>(p, ctas, s, msg);
    case kAblNoMma: return abl_launch<kAblNoMma>(p, ctas, s, msg);
    case kAblProdOnly: return abl_launch<kAblProdOnly>(p, ctas, s, msg);
    case kAblNoConv | kAblNoPromo: return abl_launch<kAblNoConv | kAblNoPromo>(p, ctas, s, msg);
    case kAblNoStore: return abl_launch<kAblNoStore>(p, ctas, s, msg);
    case kAblNoFfma: return abl_launch<kAblNoFfma>(p, ctas, s, msg);
    default: return -1;
  }
}

}  // namespace dg_w4a8
