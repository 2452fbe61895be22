// Launchers of the warp-specialised W4A8 grouped GEMM (kernel and numerics: dg_w4a8_ws.cuh).
#include "dg_w4a8_ws.h"

#include <cstdio>

#include "dg_launch.h"
#include "dg_w4a8_ws.cuh"

namespace dg_w4a8 {
namespace {

template <int NS, bool PIPE>
int ws_launch(const Params& p, int ctas, cudaStream_t stream, std::string* msg) {
  using L = WsLayout<NS>;
  int sms = 0;
  const int smem = L::bytes(p.g);
  cudaError_t err = dg_launch::opt_in_smem_once<w4a8_ws_kernel<NS, PIPE>>(L::bytes(kMaxGroups), &sms);
  if (err == cudaSuccess) {
    if (ctas <= 0) ctas = sms;  // one 384-thread CTA per SM (the ring takes most of the shared memory)
    w4a8_ws_kernel<NS, PIPE><<<ctas, L::kThreads, smem, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess && msg != nullptr) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "w4a8 ws stages=%d pipe=%d smem=%d ctas=%d: %s", NS, (int)PIPE, smem, ctas, cudaGetErrorString(err));
    *msg = buf;
  }
  return static_cast<int>(err);
}

}  // namespace

int w4a8_ws_smem_bytes(int stages, int pipe, int g) {
  if (stages == 4 && pipe <= 1) return WsLayout<4>::bytes(g);
  if (stages == 3 && pipe == 0) return WsLayout<3>::bytes(g);
  return -1;
}

int w4a8_ws_launch(int stages, int pipe, const Params& p, int ctas, cudaStream_t stream, std::string* msg) {
  if (stages == 4 && pipe == 0) return ws_launch<4, false>(p, ctas, stream, msg);
  if (stages == 4 && pipe == 1) return ws_launch<4, true>(p, ctas, stream, msg);
  if (stages == 3 && pipe == 0) return ws_launch<3, false>(p, ctas, stream, msg);
  return -1;
}

}  // namespace dg_w4a8
