// Launchers of the register-operand W4A8 grouped GEMM (kernel and numerics: dg_w4a8_rs.cuh).
#include "dg_w4a8_rs.h"

#include <cstdio>

#include "dg_w4a8_rs.cuh"

namespace dg_w4a8 {
namespace {

constexpr int kMaxDevices = 64;

// Opt in to the largest shared memory any g <= kMaxGroups needs, once per device and stage count (a launch under
// CUDA-graph capture then only launches); returns the SM count.
template <int NS, int TOK, bool FOLD, bool CHEAP = false, bool EPI = false>
cudaError_t rs_opt_in(int* sms) {
  static bool configured[kMaxDevices] = {};
  static int n_sms[kMaxDevices] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (!configured[dev]) {
    err = cudaFuncSetAttribute(w4a8_rs_kernel<NS, TOK, FOLD, CHEAP, 0, EPI>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, RsLayout<NS, TOK, FOLD, EPI>::bytes(kMaxGroups));
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&n_sms[dev], cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    configured[dev] = true;
  }
  *sms = n_sms[dev];
  return cudaSuccess;
}

template <int NS, int TOK, bool FOLD, bool CHEAP = false, bool EPI = false>
int rs_launch(const Params& p, int ctas, cudaStream_t stream, std::string* msg) {
  using L = RsLayout<NS, TOK, FOLD, EPI>;
  int sms = 0;
  const int smem = L::bytes(p.g);
  cudaError_t err = rs_opt_in<NS, TOK, FOLD, CHEAP, EPI>(&sms);
  if (err == cudaSuccess && FOLD) {  // the per-row reference exponents (p.sref: the caller's [g, n] workspace)
    const long long rows = (long long)p.g * p.n;
    w4a8_sref_kernel<<<(unsigned)((rows + 255) / 256), 256, 0, stream>>>(p.scales, const_cast<uint16_t*>(p.sref),
                                                                          rows, p.k / 32);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    if (ctas <= 0) ctas = sms;  // one 384-thread CTA per SM (the ring takes most of the shared memory)
    w4a8_rs_kernel<NS, TOK, FOLD, CHEAP, 0, EPI><<<ctas, L::kThreads, smem, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess && msg != nullptr) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "w4a8 rs stages=%d tokens=%d fold=%d cheap=%d epi=%d smem=%d ctas=%d: %s", NS, TOK,
                  (int)FOLD, (int)CHEAP, (int)EPI, smem, ctas, cudaGetErrorString(err));
    *msg = buf;
  }
  return static_cast<int>(err);
}

}  // namespace

// Keep in sync with the DG_W4A8_RS_VARIANT entries of dg_w4a8_grouped.cu.
int w4a8_rs_smem_bytes(int stages, int tok, int fold, int g) {  // fold: 0, 1 (fold), 2 (fold + cheap), 4 (epi)
  if (fold == kRsEpi && tok == 256 && stages == 4) return RsLayout<4, 256, false, true>::bytes(g);
  if (fold == kRsEpi && tok == 128 && stages == 4) return RsLayout<4, 128, false, true>::bytes(g);
  if (!fold && tok == 128 && stages == 4) return RsLayout<4, 128>::bytes(g);
  if (!fold && tok == 128 && stages == 6) return RsLayout<6, 128>::bytes(g);
  if (!fold && tok == 256 && stages == 4) return RsLayout<4, 256>::bytes(g);
  if (!fold && tok == 256 && stages == 3) return RsLayout<3, 256>::bytes(g);
  if (fold && tok == 128 && stages == 4) return RsLayout<4, 128, true>::bytes(g);
  if (fold && tok == 256 && stages == 4) return RsLayout<4, 256, true>::bytes(g);
  if (fold && tok == 256 && stages == 3) return RsLayout<3, 256, true>::bytes(g);  // (fold 1 or 2: one layout)
  return -1;
}

int w4a8_rs_launch(int stages, int tok, int fold, const Params& p, int ctas, cudaStream_t stream, std::string* msg) {
  if (fold == kRsEpi && tok == 256 && stages == 4) return rs_launch<4, 256, false, false, true>(p, ctas, stream, msg);
  if (fold == kRsEpi && tok == 128 && stages == 4) return rs_launch<4, 128, false, false, true>(p, ctas, stream, msg);
  if (!fold && tok == 128 && stages == 4) return rs_launch<4, 128, false>(p, ctas, stream, msg);
  if (!fold && tok == 128 && stages == 6) return rs_launch<6, 128, false>(p, ctas, stream, msg);
  if (!fold && tok == 256 && stages == 4) return rs_launch<4, 256, false>(p, ctas, stream, msg);
  if (!fold && tok == 256 && stages == 3) return rs_launch<3, 256, false>(p, ctas, stream, msg);
  if (fold == 1 && tok == 128 && stages == 4) return rs_launch<4, 128, true>(p, ctas, stream, msg);
  if (fold == 1 && tok == 256 && stages == 4) return rs_launch<4, 256, true>(p, ctas, stream, msg);
  if (fold == 1 && tok == 256 && stages == 3) return rs_launch<3, 256, true>(p, ctas, stream, msg);
  if (fold == 2 && tok == 256 && stages == 4) return rs_launch<4, 256, true, true>(p, ctas, stream, msg);
  return -1;
}

}  // namespace dg_w4a8
