// Launchers of the register-operand W4A8 grouped GEMM (kernel and numerics: dg_w4a8_rs.cuh).
#include "dg_w4a8_rs.h"

#include <cstdio>

#include "dg_launch.h"
#include "dg_w4a8_rs.cuh"

namespace dg_w4a8 {
namespace {


template <int NS, int TOK>
int rs_launch(const Params& p, int ctas, cudaStream_t stream, std::string* msg) {
  using L = RsLayout<NS, TOK>;
  int sms = 0;
  const int smem = L::bytes(p.g);
  cudaError_t err = dg_launch::opt_in_smem_once<w4a8_rs_kernel<NS, TOK>>(L::bytes(kMaxGroups), &sms);
  if (err == cudaSuccess) {
    if (ctas <= 0) ctas = sms;  // one 384-thread CTA per SM (the ring takes most of the shared memory)
    w4a8_rs_kernel<NS, TOK><<<ctas, L::kThreads, smem, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess && msg != nullptr) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "w4a8 rs stages=%d tokens=%d smem=%d ctas=%d: %s", NS, TOK, smem, ctas,
                  cudaGetErrorString(err));
    *msg = buf;
  }
  return static_cast<int>(err);
}

}  // namespace

// Keep in sync with the DG_W4A8_RS_VARIANT entries of dg_w4a8_grouped.cu.
int w4a8_rs_smem_bytes(int stages, int tok, int g) {
  if (tok == 128 && stages == 4) return RsLayout<4, 128>::bytes(g);
  if (tok == 128 && stages == 6) return RsLayout<6, 128>::bytes(g);
  if (tok == 256 && stages == 4) return RsLayout<4, 256>::bytes(g);
  if (tok == 256 && stages == 3) return RsLayout<3, 256>::bytes(g);
  return -1;
}

int w4a8_rs_launch(int stages, int tok, const Params& p, int ctas, cudaStream_t stream, std::string* msg) {
  if (tok == 128 && stages == 4) return rs_launch<4, 128>(p, ctas, stream, msg);
  if (tok == 128 && stages == 6) return rs_launch<6, 128>(p, ctas, stream, msg);
  if (tok == 256 && stages == 4) return rs_launch<4, 256>(p, ctas, stream, msg);
  if (tok == 256 && stages == 3) return rs_launch<3, 256>(p, ctas, stream, msg);
  return -1;
}

}  // namespace dg_w4a8
