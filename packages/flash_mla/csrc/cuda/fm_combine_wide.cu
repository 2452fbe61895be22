// Wide PDL combine of the serial sparse decode kernel's split partials (Params::merge == 3, Python merge
// "pdl_wide"): see fm_sparse_decode.cu for the partial layout (part_o fp32 [tokens * splits * H, 512] = acc / l,
// part_lse fp32 [tokens * splits * H] = base-2 m + log2 l, -inf for an empty split).
// A file of its own so that fm_sparse_decode.cu keeps its three kernels (test_mla_cuda counts them).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "fm_combine_common.cuh"
#include "fm_combine_wide.h"

namespace fm {

namespace {
constexpr int kD = 512;  // head dim

// acc += w * v per dim, in combine_kernel's order (x then y)
__device__ __forceinline__ void accumulate(float (&acc)[1], float w, float v) { acc[0] += w * v; }
__device__ __forceinline__ void accumulate(float (&acc)[2], float w, float2 v) {
  acc[0] += w * v.x;
  acc[1] += w * v.y;
}
}  // namespace

// merge == 3 ("pdl_wide"): combine_kernel's work split the same way (one warp per (token, head, 64 dims)) and the
// same arithmetic in the same order (so bit-equal to it), but without its serial chains of dependent L2 loads:
// the lanes read 32 splits' lse at a time (max by warp shuffles, exact: fmaxf is order-free), each lane computes
// one split's weight exp2(lse_s - M) (the same exp2f of the same operands), and the partial rows are loaded 8
// splits at a time before they are summed in split order. With S = 65 splits (HCA at 1M context) combine_kernel
// waits on ~65 + 65 / 4 L2 round trips per warp; this one on ~2 x ceil(S / 32) + ceil(S / 8).
// merge == 4 ("pdl_narrow", NARROW; session 10): the same per-element arithmetic and order (bit-equal), one warp per
// (token, head, 32 dims), 1 dim per lane, 16 splits' rows in flight: for few tokens (HCA at 1M, b = 1: 64 warps x 8
// = 64 CTAs read 8.5 MB of partials in 11.9 us, ~0.7 TB/s, under Nsight Compute) twice the CTAs and bytes in flight.
template <bool NARROW>
__global__ void __launch_bounds__(256) combine_wide_kernel(const float* __restrict__ part_o,
                                                           const float* __restrict__ part_lse,
                                                           const float* __restrict__ sink,
                                                           __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                                                           Params p, int64_t num_tokens) {
  using Vec = typename std::conditional<NARROW, float, float2>::type;  // one lane's dims of a partial row
  constexpr int kDims = NARROW ? 1 : 2, kInflight = NARROW ? 16 : 8;
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  CombineItem it;
  if (!combine_item<NARROW ? 4 : 3>(p, num_tokens, it)) return;
  const int lane = it.lane;
  const int64_t row0 = it.row0;
  const int S = p.num_splits;
  float m = -INFINITY;
  for (int s = lane; s < S; s += 32) m = fmaxf(m, __ldcg(part_lse + row0 + (int64_t)s * p.H));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const float m_valid = m;
  float sink_h, sink2;
  m = fold_sink(p, sink, it.head, m, sink_h, sink2);
  float l_f = 0.f;
  float acc[kDims] = {};
  const int64_t step = (int64_t)p.H * (kD / kDims);  // one split further, in Vec
  const Vec* src = reinterpret_cast<const Vec*>(part_o + row0 * kD + it.chunk * 32 * kDims + kDims * lane);
  for (int s0 = 0; s0 < S; s0 += 32, src += 32 * step) {
    const int n = min(32, S - s0);
    const float w_l = lane < n ? exp2f(__ldcg(part_lse + row0 + (int64_t)(s0 + lane) * p.H) - m) : 0.f;
    for (int j0 = 0; j0 < n; j0 += kInflight) {
      Vec v[kInflight];
#pragma unroll
      for (int u = 0; u < kInflight; ++u) {  // independent loads in flight before any is used
        v[u] = j0 + u < n ? __ldcg(src + (j0 + u) * step) : Vec{};
      }
#pragma unroll
      for (int u = 0; u < kInflight; ++u) {
        const float w = __shfl_sync(0xffffffffu, w_l, (j0 + u) & 31);  // split s0 + j0 + u's weight
        if (j0 + u < n) {  // split order, combine_kernel's expressions
          l_f += w;
          accumulate(acc, w, v[u]);
        }
      }
    }
  }
  if constexpr (NARROW) {
    combine_store1(p, it, acc[0], l_f, m, m_valid, sink_h, sink2, out, lse);
  } else {
    combine_store(p, it, make_float2(acc[0], acc[1]), l_f, m, m_valid, sink_h, sink2, out, lse);
  }
}

int launch_combine_wide(const LaunchArgs& a, cudaLaunchConfig_t* cfg, bool narrow) {
  const float* po = reinterpret_cast<const float*>(a.part_o);
  const float* pl = reinterpret_cast<const float*>(a.part_lse);
  const float* sk = reinterpret_cast<const float*>(a.sink);
  __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(a.out);
  float* l = reinterpret_cast<float*>(a.lse);
  if (!narrow) return (int)cudaLaunchKernelEx(cfg, combine_wide_kernel<false>, po, pl, sk, o, l, a.p, a.num_tokens);
  cfg->gridDim.x *= 2;  // 16 items per head, 8 per CTA
  return (int)cudaLaunchKernelEx(cfg, combine_wide_kernel<true>, po, pl, sk, o, l, a.p, a.num_tokens);
}

}  // namespace fm
