// Wide PDL combine of the serial sparse decode kernel's split partials (Params::merge == 3, Python merge
// "pdl_wide"): see fm_sparse_decode.cu for the partial layout (part_o fp32 [tokens * splits * H, 512] = acc / l,
// part_lse fp32 [tokens * splits * H] = base-2 m + log2 l, -inf for an empty split).
// A file of its own so that fm_sparse_decode.cu keeps its three kernels (test_mla_cuda counts them).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "fm_combine_common.cuh"
#include "fm_combine_wide.h"

namespace fm {

namespace {
constexpr int kD = 512;  // head dim
}  // namespace

// merge == 3 ("pdl_wide"): combine_kernel's work split the same way (one warp per (token, head, 64 dims)) and the
// same arithmetic in the same order (so bit-equal to it), but without its serial chains of dependent L2 loads:
// the lanes read 32 splits' lse at a time (max by warp shuffles, exact: fmaxf is order-free), each lane computes
// one split's weight exp2(lse_s - M) (the same exp2f of the same operands), and the partial rows are loaded 8
// splits at a time before they are summed in split order. With S = 65 splits (HCA at 1M context) combine_kernel
// waits on ~65 + 65 / 4 L2 round trips per warp; this one on ~2 x ceil(S / 32) + ceil(S / 8).
__global__ void __launch_bounds__(256) combine_wide_kernel(const float* __restrict__ part_o,
                                                           const float* __restrict__ part_lse,
                                                           const float* __restrict__ sink,
                                                           __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                                                           Params p, int64_t num_tokens) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  CombineItem it;
  if (!combine_item(p, num_tokens, it)) return;
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
  float2 a = make_float2(0.f, 0.f);
  const int64_t step = (int64_t)p.H * (kD / 2);  // one split further, in float2
  const float2* src = reinterpret_cast<const float2*>(part_o + row0 * kD + it.chunk * 64 + 2 * lane);
  for (int s0 = 0; s0 < S; s0 += 32, src += 32 * step) {
    const int n = min(32, S - s0);
    const float w_l = lane < n ? exp2f(__ldcg(part_lse + row0 + (int64_t)(s0 + lane) * p.H) - m) : 0.f;
    for (int j0 = 0; j0 < n; j0 += 8) {
      float2 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {  // 8 independent loads in flight before any is used
        v[u] = j0 + u < n ? __ldcg(src + (j0 + u) * step) : make_float2(0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float w = __shfl_sync(0xffffffffu, w_l, (j0 + u) & 31);  // split s0 + j0 + u's weight
        if (j0 + u < n) {  // split order, combine_kernel's expressions
          l_f += w;
          a.x += w * v[u].x;
          a.y += w * v[u].y;
        }
      }
    }
  }
  combine_store(p, it, a, l_f, m, m_valid, sink_h, sink2, out, lse);
}

int launch_combine_wide(const LaunchArgs& a, cudaLaunchConfig_t* cfg) {
  return (int)cudaLaunchKernelEx(cfg, combine_wide_kernel, reinterpret_cast<const float*>(a.part_o),
                                 reinterpret_cast<const float*>(a.part_lse), reinterpret_cast<const float*>(a.sink),
                                 reinterpret_cast<__nv_bfloat16*>(a.out), reinterpret_cast<float*>(a.lse), a.p,
                                 a.num_tokens);
}

}  // namespace fm
