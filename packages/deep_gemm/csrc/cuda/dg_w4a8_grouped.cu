// Launchers of the W4A8 FP8-wgmma grouped GEMM variants (kernel and numerics: dg_w4a8_grouped.cuh).
#include "dg_w4a8_grouped.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "dg_launch.h"
#include "dg_w4a8_grouped.cuh"
#include "dg_w4a8_rs.h"
#include "dg_w4a8_ws.h"

namespace dg_w4a8 {
namespace {

using dg_launch::kMaxDevices;
std::string g_last_error;

// The largest dynamic shared memory any g <= kMaxGroups needs: set once per device and instantiation, so launches
// under CUDA-graph capture only launch.
template <int WG, int NS, bool REL>
cudaError_t opt_in_smem(int* sms) {
  return dg_launch::opt_in_smem_once<w4a8_grouped_kernel<WG, NS, REL>>(Layout<WG, NS, REL>::bytes(kMaxGroups), sms);
}

// CTAs per SM at `smem` bytes, cached per device for the last smem size asked (the warm-up call fills it, so a call
// under CUDA-graph capture only launches).
template <int WG, int NS, bool REL>
cudaError_t ctas_per_sm(int smem, int* per_sm) {
  static int last_smem[kMaxDevices] = {}, last_occ[kMaxDevices] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (last_smem[dev] != smem) {
    int occ = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, w4a8_grouped_kernel<WG, NS, REL>,
                                                        Layout<WG, NS, REL>::kThreads, smem);
    if (err != cudaSuccess) return err;
    last_occ[dev] = occ > 0 ? occ : 1;
    last_smem[dev] = smem;
  }
  *per_sm = last_occ[dev];
  return cudaSuccess;
}

template <int WG, int NS, bool REL>
int launch(const Params& p, int ctas, cudaStream_t stream) {
  using L = Layout<WG, NS, REL>;
  int sms = 0;
  const int smem = L::bytes(p.g);
  cudaError_t err = opt_in_smem<WG, NS, REL>(&sms);
  if (err == cudaSuccess && ctas <= 0) {
    int per_sm = 1;
    err = ctas_per_sm<WG, NS, REL>(smem, &per_sm);
    ctas = sms * per_sm;
  }
  if (err == cudaSuccess && REL) {  // the per-row reference exponents (p.sref: the caller's [g, n] workspace)
    const long long rows = (long long)p.g * p.n;
    w4a8_sref_kernel<<<(unsigned)((rows + 255) / 256), 256, 0, stream>>>(p.scales, const_cast<uint16_t*>(p.sref),
                                                                          rows, p.k / 32);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    w4a8_grouped_kernel<WG, NS, REL><<<ctas, L::kThreads, smem, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "w4a8 wg=%d stages=%d rel=%d smem=%d ctas=%d: %s", WG, NS, (int)REL, smem, ctas,
                  cudaGetErrorString(err));
    g_last_error = buf;
  }
  return static_cast<int>(err);
}

struct Entry {
  W4A8Variant v;
  int (*run)(const Params&, int, cudaStream_t);
  int (*smem)(int);
};

template <int WG, int NS, bool REL>
int smem_of(int g) {
  return Layout<WG, NS, REL>::bytes(g);
}

// Schemes 2 ("ws") and 3 ("wsp": pipelined consumers + setmaxnreg): the warp-specialised kernel of dg_w4a8_ws.cu
// (wg is always 2 there: 2 consumer warpgroups).
template <int NS, int PIPE>
int launch_ws(const Params& p, int ctas, cudaStream_t stream) {
  return w4a8_ws_launch(NS, PIPE, p, ctas, stream, &g_last_error);
}
template <int NS, int PIPE>
int smem_of_ws(int g) {
  return w4a8_ws_smem_bytes(NS, PIPE, g);
}
#define DG_W4A8_WS_VARIANT(NS, PIPE) \
  Entry { {2, NS, 2 + PIPE}, &launch_ws<NS, PIPE>, &smem_of_ws<NS, PIPE> }

// Schemes 4 ("rs") and 5 ("rs", 256-token tiles): the register-operand kernel of dg_w4a8_rs.cu (weights as the
// wgmma's A operand from registers; 2 consumer warpgroups x 64 weight rows, 128 / 256-token tiles). (Schemes 6-10,
// the folded / cheap-conversion / fast-epilogue builds, were removed in session 9: 0.96-1.07x their twins; so were
// schemes 11-14, the chunk-pipelined n64 builds: bit-equal to 5, 0.93-0.98x it.)
template <int NS, int TOK>
int launch_rs(const Params& p, int ctas, cudaStream_t stream) {
  return w4a8_rs_launch(NS, TOK, p, ctas, stream, &g_last_error);
}
template <int NS, int TOK>
int smem_of_rs(int g) {
  return w4a8_rs_smem_bytes(NS, TOK, g);
}
#define DG_W4A8_RS_VARIANT(NS, TOK) \
  Entry { {2, NS, TOK == 128 ? 4 : 5}, &launch_rs<NS, TOK>, &smem_of_rs<NS, TOK> }

#define DG_W4A8_VARIANT(WG, NS, REL) \
  Entry { {WG, NS, REL}, &launch<WG, NS, REL>, &smem_of<WG, NS, REL> }

// Keep in sync with W4A8_CUDA_VARIANTS in backends/cuda/cuda_w4a8_grouped.py (a GPU test compares them).
const Entry kEntries[] = {
    DG_W4A8_VARIANT(2, 4, 0),  // 128 x 128 tiles, 2 consumer warpgroups
#ifndef DG_W4A8_ONLY_FIRST     // (the quick compile check builds the first variant only)
    DG_W4A8_VARIANT(2, 5, 0),  // deeper ring
    DG_W4A8_VARIANT(1, 4, 0),  // 64 x 128 tiles: half-empty tiles cost less at 64 tokens per expert, 2 CTAs per SM
    DG_W4A8_VARIANT(2, 4, 1),  // row-reference scales: one FFMA per accumulator per block (+ the s_ref pre-pass)
    DG_W4A8_VARIANT(1, 4, 1),  //
    DG_W4A8_WS_VARIANT(4, 0),  // warp-specialised (producer warpgroup converts; dg_w4a8_ws.cuh), 4-stage ring
    DG_W4A8_WS_VARIANT(3, 0),  //
    DG_W4A8_WS_VARIANT(4, 1),  // + pipelined consumers (two blocks in flight per warpgroup, setmaxnreg)
    DG_W4A8_RS_VARIANT(4, 128),  // weights as the register operand (dg_w4a8_rs.cuh), 128-token tiles
    DG_W4A8_RS_VARIANT(6, 128),  // 6-stage ring
    DG_W4A8_RS_VARIANT(4, 256),  // 256-token tiles: each converted weight fragment feeds two n128 wgmmas
    DG_W4A8_RS_VARIANT(3, 256),  //
#endif
};

const Entry* find(int wg, int stages, int rel) {
  for (const Entry& e : kEntries) {
    if (e.v.wg == wg && e.v.stages == stages && e.v.rel == rel) return &e;
  }
  return nullptr;
}

}  // namespace

const std::vector<W4A8Variant>& w4a8_variants() {
  static const std::vector<W4A8Variant> all = [] {
    std::vector<W4A8Variant> v;
    for (const Entry& e : kEntries) v.push_back(e.v);
    return v;
  }();
  return all;
}

int w4a8_smem_bytes(int wg, int stages, int rel, int g) {
  const Entry* e = find(wg, stages, rel);
  return e == nullptr ? -1 : e->smem(g);
}

int w4a8_grouped_launch(int wg, int stages, int rel, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t packed,
                        std::uintptr_t scales, std::uintptr_t offs, std::uintptr_t out, std::uintptr_t sref, int m,
                        int n, int k, int g, int ctas, std::uintptr_t stream) {
  const Entry* e = find(wg, stages, rel);
  if (e == nullptr) return -1;
  if (m < 0 || n <= 0 || n % 16 != 0 || k <= 0 || k % kBK != 0 || g < 1 || g > kMaxGroups ||
      (rel == 1 && (sref == 0 || sref % 16 != 0))) {
    char buf[320];
    std::snprintf(buf, sizeof(buf),
                  "w4a8: bad sizes m=%d n=%d k=%d g=%d rel=%d sref=%s (k %% 128, n %% 16, 1 <= g <= %d, a 16-byte "
                  "aligned sref workspace when rel = 1)",
                  m, n, k, g, rel, sref == 0 ? "null" : "set", kMaxGroups);
    g_last_error = buf;
    return -2;
  }
  if (m == 0) return 0;
  Params p{reinterpret_cast<const uint8_t*>(a),      reinterpret_cast<const float*>(sfa),
           reinterpret_cast<const uint8_t*>(packed), reinterpret_cast<const uint8_t*>(scales),
           reinterpret_cast<const int*>(offs),       reinterpret_cast<__nv_bfloat16_raw*>(out),
           reinterpret_cast<const uint16_t*>(sref),  m, n, k, g};
  return e->run(p, ctas, reinterpret_cast<cudaStream_t>(stream));
}

std::string w4a8_error_string() { return g_last_error; }

}  // namespace dg_w4a8
