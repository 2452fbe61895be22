// Sparse MLA decode/prefill kernel for sm_90a (wgmma), V4 shape: 64 heads x 512 dims per query token.
//
// One CTA = one query token's 64 heads x one split of its index list; 256 threads = 2 consumer warpgroups.
// Per 64-row KV tile (rows gathered by index into a [64 keys, 512 dims] bf16 shared tile):
//   S_w = Q[64 x 512] K_w^T        warpgroup w computes the scores of its 32 keys (wgmma m64n32k16 x 32):
//                                  nothing is duplicated (the Triton kernel computes S twice);
//   row max exchanged through shared memory, both warpgroups then share the same running max;
//   P (bf16, [64 x 64]) written to shared memory, each warpgroup its 32 columns;
//   O_w += P[64 x 64] V[64 x 256]  warpgroup w owns output dims [256 w, 256 w + 256) (wgmma m64n256k16 x 4,
//                                  128 fp32 accumulator registers per thread).
// Shared memory (all tiles [rows, 64] bf16 sub-tiles with the 128-byte swizzle, 8 KiB each, 1 KiB aligned):
//   Q 64 KiB + KV: BF16 cache 2 stages x 64 KiB (cp.async double buffering) / FP8 cache 1 x 64 KiB bf16 tile plus
//   2 x 36.5 KiB raw 584-byte rows (cp.async, dequantised smem -> smem once per tile) + P 8 KiB: 200 / 209 KiB,
//   one CTA per SM.
// Work per tile: 2 x 2 x 64 x 64 x 512 = 8.4 MFLOP over 64 KiB (BF16) / 36.5 KiB (FP8) of gathered rows.
// This first version serialises load-wait -> S -> softmax -> P @ V inside a CTA (only the next tile's gather
// overlaps); no producer warp specialisation yet. Estimated per tile (1 CTA / SM, 128 B/clk of shared memory):
// S = 64 wgmma m64n32k16 (both warpgroups) reading 3 KiB each from shared memory, ~1,500 clk (shared-memory bound:
// q is re-read by every instruction); P @ V = 8 m64n256k16, ~1,000 clk (tensor bound); softmax + 4 barriers
// ~500 clk; i.e. ~1.9 us per 64-row tile against ~1.1 us of tensor work at peak. Next steps once measured:
// split S over d (each warpgroup m64n64 over 256 dims, partial S summed through shared memory: 2/3 of the shared
// traffic), and overlap S of tile t + 1 with softmax / P @ V of tile t (needs a third KV stage or BN = 32).
//
// Split-KV: split s of a token owns tiles [s * per_split, (s + 1) * per_split) of cdiv(topk, 64); with
// num_splits == 1 the kernel writes out (bf16) and lse (natural log, sink included); otherwise the partial
// output acc / l (fp32) and base-2 lse m + log2 l, the format of triton_split_attn's _combine_kernel.
// Holes: any index outside [0, n_rows) is skipped (row zero-filled, score -inf), so NaN in unused cache slots
// never enters the math.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "fm_wgmma.cuh"
#include "fm_sparse_decode.h"

namespace fm {

constexpr int kH = 64;         // heads per CTA (the wgmma M)
constexpr int kD = 512;        // head dim
constexpr int kBN = 64;        // KV rows per tile
constexpr int kThreads = 256;  // two warpgroups
constexpr int kSub = 64 * 128;  // one [64 rows, 64 bf16] swizzled sub-tile: 8 KiB
constexpr int kTile = 8 * kSub;  // [64, 512] bf16: 64 KiB
constexpr int kFp8Row = 584;
constexpr int kFp8Stage = kBN * kFp8Row;  // 37,376 B

struct Smem {
  static constexpr int q = 0;
  static constexpr int kv = kTile;                 // BF16: 2 stages; FP8: 1 bf16 tile
  __host__ __device__ static constexpr int p(bool fp8) { return fp8 ? 2 * kTile : 3 * kTile; }
  __host__ __device__ static constexpr int raw(bool fp8) { return p(fp8) + kSub; }  // FP8 staging (2 stages)
  __host__ __device__ static constexpr int small(bool fp8) { return raw(fp8) + (fp8 ? 2 * kFp8Stage : 0); }
  // small: rows[2][64] int, red[2][64] float
  __host__ __device__ static constexpr int total(bool fp8) { return small(fp8) + 2 * 64 * 4 + 2 * 64 * 4; }
};

// Byte offset of 16-byte chunk c (0..63) of row r in a [rows, 512] tile made of 8 [rows, 64] swizzled sub-tiles:
// sub-tile c / 8, row r at 128 B, chunk (c % 8) XOR (r % 8) (CUTLASS Swizzle<3,4,3>, what wgmma's 128B mode reads).
__device__ __forceinline__ uint32_t swz(int r, int c, int rows) {
  return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// wgmma shared-memory descriptor, 128-byte swizzle: start >> 4, LBO >> 4 at bit 16, SBO >> 4 at bit 32, mode 1 at 62.
__device__ __forceinline__ uint64_t gmma_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= (uint64_t)((smem_addr & 0x3FFFF) >> 4);
  d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
  d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
  d |= (uint64_t)1 << 62;
  return d;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
// Ordinary / cp.async writes to shared memory that wgmma (the async proxy) reads next.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_arrive() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void reg_fence(float* r) {  // keep the compiler from moving accumulator accesses
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

__device__ __forceinline__ int load_row_id(const int* idx_row, int pos, int topk, int64_t n_rows) {
  if (pos >= topk) return -1;
  int v = __ldg(idx_row + pos);
  return (v >= 0 && (int64_t)v < n_rows) ? v : -1;
}

// Issue the gather of one 64-row tile. BF16: 16-byte cp.async straight into the swizzled tile (holes zero-filled).
// FP8: 8-byte cp.async of the raw 584-byte rows into the staging buffer (rows are only 8-byte aligned).
template <bool FP8>
__device__ __forceinline__ void issue_tile(uint8_t* smem, int stage, const int* rows, const uint8_t* kv,
                                           int64_t stride_kv_bytes, int tid) {
  if constexpr (!FP8) {
    uint32_t base = smem_u32(smem + Smem::kv + stage * kTile);
    int c = tid & 63;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      int r = (tid >> 6) + 4 * i;
      int row = rows[r];
      const uint8_t* src = kv + (int64_t)(row < 0 ? 0 : row) * stride_kv_bytes + c * 16;
      cp_async16(base + swz(r, c, kBN), src, row >= 0);
    }
  } else {
    uint32_t base = smem_u32(smem + Smem::raw(true) + stage * kFp8Stage);
    for (int i = tid; i < kBN * (kFp8Row / 8); i += kThreads) {
      int r = i / (kFp8Row / 8), c = i % (kFp8Row / 8);
      int row = rows[r];
      const uint8_t* src = kv + (int64_t)(row < 0 ? 0 : row) * kFp8Row + c * 8;
      cp_async8(base + r * kFp8Row + c * 8, src, row >= 0);
    }
  }
}

// FP8 staging rows -> bf16 swizzled tile: dims < 448 are e4m3 x 2^(scale byte - 127) (exact in bf16; byte 255 is
// NaN as in the reference), dims 448..511 the bf16 RoPE values. One scale per 8-dim chunk: no per-element gather.
__device__ __forceinline__ void dequant_tile(uint8_t* smem, int stage, int tid) {
  const uint8_t* raw = smem + Smem::raw(true) + stage * kFp8Stage;
  uint8_t* dst = smem + Smem::kv;
  int c = tid & 63;
#pragma unroll 4
  for (int i = 0; i < 16; ++i) {
    int r = (tid >> 6) + 4 * i;
    const uint8_t* row = raw + r * kFp8Row;
    uint4 outv;
    if (c < 56) {
      uint2 b = *reinterpret_cast<const uint2*>(row + c * 8);
      uint32_t sb = row[576 + (c >> 3)];
      float s = sb == 255u ? __int_as_float(0x7fc00000) : __int_as_float((int)(sb << 23));
      uint32_t w[2] = {b.x, b.y};
      uint32_t o[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[h] >> (16 * k)), __NV_E4M3);
          float2 f = __half22float2(*reinterpret_cast<__half2*>(&hr));
          __nv_bfloat162 bb = __floats2bfloat162_rn(f.x * s, f.y * s);
          o[2 * h + k] = *reinterpret_cast<uint32_t*>(&bb);
        }
      }
      outv = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
      const uint2* src = reinterpret_cast<const uint2*>(row + 448 + (c - 56) * 16);
      uint2 a = src[0], b = src[1];
      outv = make_uint4(a.x, a.y, b.x, b.y);
    }
    *reinterpret_cast<uint4*>(dst + swz(r, c, kBN)) = outv;
  }
}

template <bool FP8>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_decode_kernel(const __nv_bfloat16* __restrict__ q, const uint8_t* __restrict__ kv,
                         const int* __restrict__ idx, const float* __restrict__ sink, __nv_bfloat16* __restrict__ out,
                         float* __restrict__ lse, float* __restrict__ part_o, float* __restrict__ part_lse,
                         Params p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Dynamic shared memory is only 16-byte aligned by contract: align to 1 KiB (the swizzle atom) by hand.
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  int* s_rows = reinterpret_cast<int*>(smem + Smem::small(FP8));  // [2][64] row ids (-1: hole) per stage
  float* s_red = reinterpret_cast<float*>(s_rows + 128);             // [2][64] per-warpgroup row max / sum

  const int tid = threadIdx.x, wg = tid >> 7, t128 = tid & 127, warp = t128 >> 5, lane = tid & 31;
  const int num_hb = p.H / kH;
  const int hb = blockIdx.x % num_hb;
  const int split = (blockIdx.x / num_hb) % p.num_splits;
  const int64_t tok = blockIdx.x / (num_hb * p.num_splits);
  const int n_tiles = (p.topk + kBN - 1) / kBN;
  const int lo = split * p.tiles_per_split;
  const int hi = min(lo + p.tiles_per_split, n_tiles);
  const int* idx_row = idx + tok * p.stride_it;
  const int64_t stride_kv_bytes = FP8 ? kFp8Row : p.stride_kv * 2;

  // Q [64 heads, 512] -> swizzled smem (cp.async group 0, together with the first tile).
  {
    const __nv_bfloat16* qt = q + tok * p.stride_qt + (int64_t)hb * kH * p.stride_qh;
    uint32_t base = smem_u32(smem + Smem::q);
    int c = tid & 63;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      int r = (tid >> 6) + 4 * i;
      cp_async16(base + swz(r, c, kH), qt + (int64_t)r * p.stride_qh + c * 8, true);
    }
  }
  if (tid < 64) s_rows[tid] = lo < hi ? load_row_id(idx_row, lo * kBN + tid, p.topk, p.n_rows) : -1;
  __syncthreads();
  if (lo < hi) issue_tile<FP8>(smem, 0, s_rows, kv, stride_kv_bytes, tid);
  cp_commit();
  if (tid < 64) s_rows[64 + tid] = load_row_id(idx_row, (lo + 1) * kBN + tid, p.topk, p.n_rows);

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max (base 2) of rows r0 = 16 warp + lane / 4, r1 = r0 + 8
  float l_run[2] = {0.f, 0.f};              // this thread's partial row sums (its 8 columns per tile)
  const int r0 = warp * 16 + (lane >> 2);

  for (int t = lo; t < hi; ++t) {
    const int j = t - lo, st = j & 1;
    int next_row = -1;  // row id of tile t + 2 for thread tid < 64, loaded early to hide its latency
    if (tid < 64) next_row = load_row_id(idx_row, (t + 2) * kBN + tid, p.topk, p.n_rows);
    __syncthreads();  // (A) s_rows[st ^ 1] written; the previous tile's buffers are free
    if (t + 1 < hi) issue_tile<FP8>(smem, st ^ 1, s_rows + 64 * (st ^ 1), kv, stride_kv_bytes, tid);
    cp_commit();
    cp_wait1();  // this thread's copies of tile t (and Q) have landed
    if constexpr (FP8) {
      __syncthreads();  // (B) every thread's raw rows of tile t
      dequant_tile(smem, st, tid);
    }
    fence_async_smem();
    __syncthreads();  // (C) the bf16 tile is complete and visible to wgmma

    // ---- S_w = Q K_w^T: [64 heads x 32 keys], keys 32 wg .. 32 wg + 31 of the tile.
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.f;
    const uint32_t q_base = smem_u32(smem + Smem::q);
    const uint32_t kv_base = smem_u32(smem + Smem::kv + (FP8 ? 0 : st * kTile));
    reg_fence<16>(s);
    wg_arrive();
#pragma unroll
    for (int ks = 0; ks < 32; ++ks) {
      const uint32_t koff = (ks >> 2) * kSub + (ks & 3) * 32;  // sub-tile, then 16 dims = 32 B inside the row
      wgmma_m64n32k16_kk(s, gmma_desc(q_base + koff, 16, 1024), gmma_desc(kv_base + koff + wg * 32 * 128, 16, 1024),
                         1);
    }
    wg_commit();
    wg_wait0();
    reg_fence<16>(s);

    // ---- online softmax (base 2). Thread holds s[4 j + {0,1}] at (r0, col), s[4 j + {2,3}] at (r0 + 8, col),
    // col = 32 wg + 8 j + 2 (lane % 4) + {0, 1}.
    const int* rows_t = s_rows + 64 * st;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 32 * wg + 8 * jj + 2 * (lane & 3) + e;
        const bool ok = rows_t[col] >= 0;
        s[4 * jj + e] = ok ? s[4 * jj + e] * p.qk_scale : -INFINITY;
        s[4 * jj + 2 + e] = ok ? s[4 * jj + 2 + e] * p.qk_scale : -INFINITY;
        mx[0] = fmaxf(mx[0], s[4 * jj + e]);
        mx[1] = fmaxf(mx[1], s[4 * jj + 2 + e]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
    }
    if ((lane & 3) == 0) {
      s_red[wg * 64 + r0] = mx[0];
      s_red[wg * 64 + r0 + 8] = mx[1];
    }
    __syncthreads();  // (M) both warpgroups' row maxima
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      const float m_new = fmaxf(m_run[h], fmaxf(s_red[r], s_red[64 + r]));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing valid yet: any finite shift works
      alpha[h] = exp2f(m_run[h] - m_use);
      l_run[h] *= alpha[h];
      m_run[h] = m_new;
      mx[h] = m_use;
    }
    uint8_t* p_tile = smem + Smem::p(FP8);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int col = 32 * wg + 8 * jj + 2 * (lane & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = exp2f(s[4 * jj + 2 * h] - mx[h]), p1 = exp2f(s[4 * jj + 2 * h + 1] - mx[h]);
        l_run[h] += p0 + p1;
        const int r = r0 + 8 * h;
        __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
        *reinterpret_cast<__nv_bfloat162*>(p_tile + r * 128 + ((((col >> 3) ^ (r & 7))) << 4) + (col & 7) * 2) = pb;
      }
    }
#pragma unroll
    for (int i = 0; i < 128; i += 4) {
      acc[i] *= alpha[0];
      acc[i + 1] *= alpha[0];
      acc[i + 2] *= alpha[1];
      acc[i + 3] *= alpha[1];
    }
    fence_async_smem();
    __syncthreads();  // (D) P complete; every thread has read this tile's s_rows and s_red
    if (tid < 64) s_rows[64 * st + tid] = next_row;

    // ---- O_w += P V_w: P [64 x 64 keys] K-major, V = KV tile dims 256 wg .. +255 (MN-major: 4 sub-tiles at LBO).
    const uint32_t p_base = smem_u32(p_tile);
    reg_fence<128>(acc);
    wg_arrive();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma_m64n256k16_tb(acc, gmma_desc(p_base + ks * 32, 16, 1024),
                          gmma_desc(kv_base + 4 * wg * kSub + ks * 16 * 128, kSub, 1024), 1);
    }
    wg_commit();
    wg_wait0();
    reg_fence<128>(acc);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");

  // ---- finish: row sums over the quad and both warpgroups (the running max is the same in both).
  float l_tot[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 2);
  }
  __syncthreads();  // s_red is free (its last reads were before barrier D)
  if ((lane & 3) == 0) {
    s_red[wg * 64 + r0] = l_run[0];
    s_red[wg * 64 + r0 + 8] = l_run[1];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) l_tot[h] = s_red[r0 + 8 * h] + s_red[64 + r0 + 8 * h];
  const int col0 = 256 * wg + 2 * (lane & 3);
  if (p.num_splits == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = hb * kH + r0 + 8 * h;
      const float m = m_run[h];
      float m_f = m, sink_h = 0.f, sink2 = 0.f;
      if (p.has_sink) {
        sink_h = sink[head];
        sink2 = sink_h * 1.4426950408889634f;
        m_f = fmaxf(m, sink2);
      }
      if (m_f == -INFINITY) m_f = 0.f;
      const float a = exp2f(m - m_f);
      float l_f = l_tot[h] * a;
      if (p.has_sink) l_f += exp2f(sink2 - m_f);
      const bool has = l_f > 0.f;
      const float so = has ? a / l_f : 0.f;
      __nv_bfloat16* orow = out + tok * p.stride_ot + (int64_t)head * p.stride_oh;
#pragma unroll
      for (int jn = 0; jn < 32; ++jn) {
        *reinterpret_cast<__nv_bfloat162*>(orow + col0 + 8 * jn) =
            __floats2bfloat162_rn(acc[4 * jn + 2 * h] * so, acc[4 * jn + 2 * h + 1] * so);
      }
      if (wg == 0 && (lane & 3) == 0) {
        float lv = has ? (m_f + log2f(l_f)) * 0.6931471805599453f : -INFINITY;
        if (p.has_sink && m == -INFINITY) lv = sink_h;
        lse[tok * p.stride_lt + (int64_t)head * p.stride_lh] = lv;
      }
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = hb * kH + r0 + 8 * h;
      const bool has = l_tot[h] > 0.f;
      const float so = has ? 1.f / l_tot[h] : 0.f;
      const int64_t prow = (tok * p.num_splits + split) * (int64_t)p.H + head;
      float* orow = part_o + prow * kD;
#pragma unroll
      for (int jn = 0; jn < 32; ++jn) {
        *reinterpret_cast<float2*>(orow + col0 + 8 * jn) =
            make_float2(acc[4 * jn + 2 * h] * so, acc[4 * jn + 2 * h + 1] * so);
      }
      if (wg == 0 && (lane & 3) == 0) part_lse[prow] = has ? m_run[h] + log2f(l_tot[h]) : -INFINITY;
    }
  }
}

template <bool FP8>
static int launch_impl(const LaunchArgs& a, cudaStream_t stream) {
  const int smem = Smem::total(FP8) + 1024;  // + alignment slack
  auto kern = sparse_decode_kernel<FP8>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return (int)e;
  const Params& p = a.p;
  const int64_t grid = (int64_t)a.num_tokens * p.num_splits * (p.H / kH);
  if (grid <= 0) return 0;
  kern<<<(unsigned)grid, kThreads, smem, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(a.q), reinterpret_cast<const uint8_t*>(a.kv),
      reinterpret_cast<const int*>(a.idx), reinterpret_cast<const float*>(a.sink),
      reinterpret_cast<__nv_bfloat16*>(a.out), reinterpret_cast<float*>(a.lse), reinterpret_cast<float*>(a.part_o),
      reinterpret_cast<float*>(a.part_lse), p);
  return (int)cudaGetLastError();
}

}  // namespace fm

int fm_launch_sparse_decode(const fm::LaunchArgs& a, bool fp8, uintptr_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  return fp8 ? fm::launch_impl<true>(a, s) : fm::launch_impl<false>(a, s);
}

const char* fm_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

int fm_smem_bytes(bool fp8) { return fp8 ? fm::Smem::total(true) + 1024 : fm::Smem::total(false) + 1024; }
