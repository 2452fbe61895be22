// Device helpers shared by the split merges of the serial sparse decode kernel: merge_last / combine_kernel
// (fm_sparse_decode.cu) and combine_wide_kernel (fm_combine_wide.cu). They carry the arithmetic that makes the
// merges bit-equal to each other (the sink folded into the running max, the final normalise and lse), so it is
// written once. Partial layout: part_o fp32 [tokens * splits * H, 512] = acc / l, part_lse fp32 [tokens * splits * H]
// = base-2 m + log2 l (-inf for an empty split).
#pragma once
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "fm_sparse_decode.h"

namespace fm {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// One warp's work item of the PDL merges: (token, head, 64 output dims), lane 2 of those dims.
struct CombineItem {
  int lane, chunk, head;
  int64_t tok, row0;  // row0: the split-0 row of (tok, head); split s is row0 + s * H
};

// Item of warp (blockIdx.x * 8 + warp); false past the last one (warp-uniform, so shuffles see full warps).
__device__ __forceinline__ bool combine_item(const Params& p, int64_t num_tokens, CombineItem& it) {
  it.lane = threadIdx.x & 31;
  const int64_t item = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (item >= num_tokens * p.H * 8) return false;
  it.chunk = (int)(item & 7);
  it.head = (int)((item >> 3) % p.H);
  it.tok = (item >> 3) / p.H;
  it.row0 = it.tok * p.num_splits * (int64_t)p.H + it.head;
  return true;
}

// The sink's logit joins the max of the splits' lse (base 2); an all-empty row without a sink gets max 0 (its
// weights are all 0). Returns the max to subtract; sink_h / sink2 are the sink in natural / base-2 units.
__device__ __forceinline__ float fold_sink(const Params& p, const float* __restrict__ sink, int head, float m,
                                           float& sink_h, float& sink2) {
  sink_h = 0.f;
  sink2 = 0.f;
  if (p.has_sink) {
    sink_h = sink[head];
    sink2 = sink_h * kLog2e;
    m = fmaxf(m, sink2);
  }
  return m == -INFINITY ? 0.f : m;
}

// Normalise the merged sum a (2 dims of the item) by l_f (+ the sink's weight), store them as bf16, and the head's
// lse (natural log) from lane 0 of chunk 0: -inf without any entry, the sink's logit when only the sink counts.
__device__ __forceinline__ void combine_store(const Params& p, const CombineItem& it, float2 a, float l_f, float m,
                                              float m_valid, float sink_h, float sink2, __nv_bfloat16* __restrict__ out,
                                              float* __restrict__ lse) {
  if (p.has_sink) l_f += exp2f(sink2 - m);
  const bool has = l_f > 0.f;
  const float so = has ? 1.f / l_f : 0.f;
  *reinterpret_cast<__nv_bfloat162*>(out + it.tok * p.stride_ot + (int64_t)it.head * p.stride_oh + it.chunk * 64 +
                                     2 * it.lane) = __floats2bfloat162_rn(a.x * so, a.y * so);
  if (it.chunk == 0 && it.lane == 0) {
    float lv = has ? (m + log2f(l_f)) * kLn2 : -INFINITY;
    if (p.has_sink && m_valid == -INFINITY) lv = sink_h;
    lse[it.tok * p.stride_lt + (int64_t)it.head * p.stride_lh] = lv;
  }
}

}  // namespace fm
