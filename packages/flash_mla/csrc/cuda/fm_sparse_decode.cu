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
// Index space: the main list (topk entries into kv) followed by the extra list (topk2 entries into kv2, e.g. the
// step's fresh KV rows; same row format as kv), cut into 64-entry tiles: a tile may hold rows of both caches (the
// shared-memory row table holds one global address per row, 0 = hole).
// Split-KV: split s of a token owns tiles [s * per_split, (s + 1) * per_split) of cdiv(topk + topk2, 64); with
// num_splits == 1 the kernel writes out (bf16) and lse (natural log, sink included); otherwise the partial
// output acc / l (fp32) and base-2 lse m + log2 l, the format of triton_split_attn's _combine_kernel. Merging the
// partials (Params::merge): 0 = by the caller (the Triton combine), 1 = by `combine_kernel` below, launched with
// programmatic dependent launch (PDL: its CTAs start on the idle SMs while this kernel runs and wait in
// griddepcontrol.wait, so no launch gap), 2 = by the last CTA of each (token, head block) to finish (an atomic
// counter per token; one launch, the last CTA reads the other splits' partials from L2), 3 = by
// `combine_wide_kernel` (PDL as 1, the same result bit for bit, fewer serial L2 round trips).
// Holes: any index outside [0, n_rows) is skipped (row zero-filled, score -inf), so NaN in unused cache slots
// never enters the math; a tile without any valid row is skipped whole (exact: it would change nothing).
// Heads: ceil(H / 64) head blocks; a partial last block zero-fills its missing q rows and stores nothing for them.
// FP8 tile paths (kv_mode of fm_launch_sparse_decode): 1 = "stage" (issue_tile<true> raw staging + dequant_tile,
// above), 2 = "fp8v" (session 9, VEC: vec_load / vec_store: each thread's 7 e4m3 units + 2 RoPE chunks go from
// global memory to registers to the bf16 tile, converted by fm_fp8v.cuh's dequant8v; no staging, no smem -> smem
// pass, no integer division; tile t + 1's loads are issued right after tile t's stores, so they fly behind its math).
// Same bits (dequant8v == dequant_tile's fp32 multiply); the raw staging area is left unused by VEC.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "fm_wgmma.cuh"
#include "fm_sparse_decode.h"
#include "fm_combine_common.cuh"
#include "fm_combine_wide.h"
#include "fm_fp8v.cuh"

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
  // small: rows[2][64] uint64 (global row address, 0 = hole), red[2][64] float, flag[4] int
  __host__ __device__ static constexpr int total(bool fp8) { return small(fp8) + 2 * 64 * 8 + 2 * 64 * 4 + 16; }
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
// gmma_desc(addr + off, ...) from d = gmma_desc(addr, ...): one add on the low word (fm_ws3_decode.cu's desc_at).
__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t off) {
  return (d & 0xffffffff00000000ull) | (uint32_t)((uint32_t)d + (off >> 4));  // 32-bit add: no carry chain
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
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

// Prefill with several waves of CTAs (prefetch_ahead > 0): the CTA of token `tok` (split 0) prefetches into L2 the
// index rows and q rows of the token that will start about one wave later, so that CTA's first loads (indices ->
// first tile's gather, and q) hit L2 instead of HBM. Hints only (prefetch never faults; addresses are in bounds).
__device__ __forceinline__ void prefetch_token(const Params& p, const __nv_bfloat16* q, const int* idx, const int* idx2,
                                               int64_t tok, int hb, int tid) {
  const int64_t ft = tok + p.prefetch_ahead;
  if (ft >= p.num_tokens || tid >= 128) return;
  const char* i1 = reinterpret_cast<const char*>(idx + ft * p.stride_it);
  for (int off = tid * 128; off < p.topk * 4; off += 128 * 128) prefetch_l2(i1 + off);
  const char* i2 = reinterpret_cast<const char*>(idx2 + ft * p.stride_it2);
  for (int off = tid * 128; off < p.topk2 * 4; off += 128 * 128) prefetch_l2(i2 + off);
  const int h_in = min(kH, p.H - hb * kH);  // q rows: 1 KiB = 8 lines per head
  const __nv_bfloat16* qt = q + ft * p.stride_qt + (int64_t)hb * kH * p.stride_qh;
  for (int i = tid; i < h_in * 8; i += 128) prefetch_l2(qt + (int64_t)(i >> 3) * p.stride_qh + (i & 7) * 64);
}

// Global address of entry pos of the token's concatenated index list (main list, then extra list), 0 for a hole.
__device__ __forceinline__ uint64_t load_row(const Params& p, const uint8_t* kv, const int* idx_row,
                                             const uint8_t* kv2, const int* idx2_row, int pos) {
  if (pos < p.topk) {
    const int v = __ldg(idx_row + pos);
    return (v >= 0 && (int64_t)v < p.n_rows) ? reinterpret_cast<uint64_t>(kv + (int64_t)v * p.stride_kv) : 0ull;
  }
  pos -= p.topk;
  if (pos < p.topk2) {
    const int v = __ldg(idx2_row + pos);
    return (v >= 0 && (int64_t)v < p.n_rows2) ? reinterpret_cast<uint64_t>(kv2 + (int64_t)v * p.stride_kv2) : 0ull;
  }
  return 0ull;
}

// Issue the gather of one 64-row tile (rows: global row addresses, 0 = hole; `dummy` any readable address for the
// zero-filling copies of holes). BF16: 16-byte cp.async straight into the swizzled tile (holes zero-filled).
// FP8: 8-byte cp.async of the raw 584-byte rows into the staging buffer (rows are only 8-byte aligned).
template <bool FP8>
__device__ __forceinline__ void issue_tile(uint8_t* smem, int stage, const uint64_t* rows, const uint8_t* dummy,
                                           int tid) {
  if constexpr (!FP8) {
    // warp W, lane group g = lane / 8, e = lane % 8: chunks 8 k + e of rows 4 W + g + 32 i (4 rows x 128 bytes per
    // warp instruction: fm_ws3_decode.cu's issue_bf16_tile says why)
    const uint32_t base = smem_u32(smem + Smem::kv + stage * kTile);
    const int e = tid & 7, r0 = 4 * (tid >> 5) + ((tid >> 3) & 3);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r0 + 32 * i;
      const uint64_t row = rows[r];
      const uint8_t* src = row ? reinterpret_cast<const uint8_t*>(row) + e * 16 : dummy;
      const uint32_t d = base + swz(r, e, kBN);
#pragma unroll
      for (int k = 0; k < 8; ++k) cp_async16(d + k * kBN * 128, row ? src + 128 * k : dummy, row != 0);
    }
  } else {
    uint32_t base = smem_u32(smem + Smem::raw(true) + stage * kFp8Stage);
    for (int i = tid; i < kBN * (kFp8Row / 8); i += kThreads) {
      int r = i / (kFp8Row / 8), c = i % (kFp8Row / 8);
      const uint64_t row = rows[r];
      const uint8_t* src = row ? reinterpret_cast<const uint8_t*>(row) + c * 8 : dummy;
      cp_async8(base + r * kFp8Row + c * 8, src, row != 0);
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

// ------------------------------------------------------------------------ fp8v: FP8 tile straight from global memory
// (session 9, kv_mode 2; VEC = true). No raw staging, no smem -> smem pass: each thread loads its fixed pieces of the
// tile into registers (ws3p kOptVec's 16-byte e4m3 units: 64 rows x 28 units = 7 per thread, unit u = dims 16 u ..
// 16 u + 15 with ONE scale byte 576 + u / 4; 64 rows x 8 RoPE 16-byte chunks = 2 per thread), converts with
// fm_fp8v::dequant8v (bit-identical to dequant_tile's fp32 multiply: see fm_fp8v.cuh) and stores 16-byte chunks into
// the swizzled bf16 tile. Piece i of thread tid is item tid + 256 i of the row-major (row, unit) grid: 256 = 9 x 28 + 4,
// so (row, unit) steps by (9, 4) with one wrap test, no division in the loop (tid / 28 once per CTA). Each 16-byte
// unit is two 8-byte loads (rows are only 8-byte aligned), all three loads predicated on the row address (0 = hole:
// zeros, scale byte 0 -> +0, as the zero-filled staging rows of dequant_tile).
struct VecRegs {
  uint2 a[7], b[7];  // piece i: chunk 2 u + h (a) and chunk 2 u + 1 - h (b), h = (u / 4) % 2 (bank-conflict free)
  uint32_t sb[7];    // scale byte of piece i
  uint2 ra[2], rb[2];  // RoPE chunk tid % 8 of rows tid / 8 + 32 j: bytes 448 + 16 (tid % 8) + {0, 8}
};

// Three loads from row address `row` (+ byte offsets o1, o2, os), predicated on row != 0 (one setp); zeros for a hole.
__device__ __forceinline__ void ldg_piece_if(uint64_t row, uint32_t o1, uint32_t o2, uint32_t os, uint2& x, uint2& y,
                                             uint32_t& sb) {
  const uint8_t* r = reinterpret_cast<const uint8_t*>(row);
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.u64 q, %8, 0;\nmov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
      "mov.b32 %4, 0;\n@q ld.global.nc.v2.u32 {%0, %1}, [%5];\n@q ld.global.nc.v2.u32 {%2, %3}, [%6];\n"
      "@q ld.global.nc.u8 %4, [%7];\n}\n"
      : "=r"(x.x), "=r"(x.y), "=r"(y.x), "=r"(y.y), "=r"(sb)
      : "l"(r + o1), "l"(r + o2), "l"(r + os), "l"(row));
}
__device__ __forceinline__ void ldg_rope_if(uint64_t row, uint32_t o, uint2& x, uint2& y) {
  const uint8_t* r = reinterpret_cast<const uint8_t*>(row);
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.u64 q, %6, 0;\nmov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
      "@q ld.global.nc.v2.u32 {%0, %1}, [%4];\n@q ld.global.nc.v2.u32 {%2, %3}, [%5];\n}\n"
      : "=r"(x.x), "=r"(x.y), "=r"(y.x), "=r"(y.y)
      : "l"(r + o), "l"(r + o + 8), "l"(row));
}

// This thread's fixed (row, unit) of piece 0 (tid / 28, tid % 28: computed once per CTA); piece i: step (9, 4) i times.
struct VecMap {
  int r, u;
};
__device__ __forceinline__ void vec_step(int& r, int& u) {
  u += 4;
  r += 9;
  if (u >= 28) {
    u -= 28;
    r += 1;
  }
}

// Issue every load of one tile (rows: its 64 row addresses in shared memory) into v; nothing waits here.
__device__ __forceinline__ void vec_load(VecRegs& v, const uint64_t* rows, VecMap m, int tid) {
  int r = m.r, u = m.u;
#pragma unroll
  for (int i = 0; i < 7; ++i) {
    const uint32_t h = (uint32_t)(u >> 2) & 1u;
    const uint32_t o = 16u * (uint32_t)u;
    ldg_piece_if(rows[r], o + 8u * h, o + 8u - 8u * h, 576u + (uint32_t)(u >> 2), v.a[i], v.b[i], v.sb[i]);
    vec_step(r, u);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) ldg_rope_if(rows[(tid >> 3) + 32 * j], 448u + 16u * (uint32_t)(tid & 7), v.ra[j], v.rb[j]);
}

// Convert v and store it into the bf16 tile (Smem::kv). Chunk 2 u + 1 - h sits at chunk 2 u + h's address ^ 16 (the
// two chunks differ in bit 0 of the chunk index, which the XOR swizzle keeps in bit 4 of the offset).
__device__ __forceinline__ void vec_store(uint8_t* smem, const VecRegs& v, VecMap m, int tid) {
  const uint32_t base = smem_u32(smem + Smem::kv);
  int r = m.r, u = m.u;
#pragma unroll
  for (int i = 0; i < 7; ++i) {
    const int h = (u >> 2) & 1;
    const uint32_t addr = base + swz(r, 2 * u + h, kBN);
    const uint32_t m2 = fm_fp8v::bf16x2_scale(v.sb[i]);
    fm_fp8v::sts128(addr, fm_fp8v::dequant8v(v.a[i], m2));
    fm_fp8v::sts128(addr ^ 16u, fm_fp8v::dequant8v(v.b[i], m2));
    vec_step(r, u);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint32_t addr = base + swz((tid >> 3) + 32 * j, 56 + (tid & 7), kBN);
    fm_fp8v::sts128(addr, make_uint4(v.ra[j].x, v.ra[j].y, v.rb[j].x, v.rb[j].y));
  }
}

// This thread's 64 columns of output row r0 + 8 h (acc * so) as bf16.
__device__ __forceinline__ void store_row_bf16(__nv_bfloat16* orow, const float (&acc)[128], int h, float so,
                                               int col0) {
#pragma unroll
  for (int jn = 0; jn < 32; ++jn) {
    *reinterpret_cast<__nv_bfloat162*>(orow + col0 + 8 * jn) =
        __floats2bfloat162_rn(acc[4 * jn + 2 * h] * so, acc[4 * jn + 2 * h + 1] * so);
  }
}

// merge == 2, run by the last CTA of a (token, head block): the other splits' partials (read from L2) merged into
// this CTA's own (acc, m_run, l_tot still in registers) with the sink, then out / lse stored. Same math as
// triton_split_attn._combine_kernel: weights 2^(lse_s - M), M the largest split lse (and the sink).
__device__ __forceinline__ void merge_last(float (&acc)[128], const float (&m_run)[2], const float (&l_tot)[2],
                                           const float* __restrict__ part_o, const float* __restrict__ part_lse,
                                           const float* __restrict__ sink, __nv_bfloat16* __restrict__ out,
                                           float* __restrict__ lse, const Params& p, int64_t tok, int hb, int split,
                                           int r0, int col0, bool lse_writer) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = hb * kH + r0 + 8 * h;
    if (head >= p.H) continue;
    const float own = l_tot[h] > 0.f ? m_run[h] + log2f(l_tot[h]) : -INFINITY;
    const int64_t row0 = tok * p.num_splits * (int64_t)p.H + head;  // split s: row0 + s * H
    float mx = -INFINITY;
    for (int s = 0; s < p.num_splits; ++s) mx = fmaxf(mx, s == split ? own : __ldcg(part_lse + row0 + s * p.H));
    const float m_valid = mx;
    float sink_h, sink2;
    mx = fold_sink(p, sink, head, mx, sink_h, sink2);
    const float w_own = exp2f(own - mx);
    const float s_own = l_tot[h] > 0.f ? w_own * (1.f / l_tot[h]) : 0.f;
#pragma unroll
    for (int jn = 0; jn < 32; ++jn) {
      acc[4 * jn + 2 * h] *= s_own;
      acc[4 * jn + 2 * h + 1] *= s_own;
    }
    float l_f = 0.f;
    for (int s = 0; s < p.num_splits; ++s) {
      if (s == split) {
        l_f += w_own;
        continue;
      }
      const float w = exp2f(__ldcg(part_lse + row0 + s * p.H) - mx);
      l_f += w;
      if (w == 0.f) continue;  // an empty split (or one the sink / max dwarfs): its partial adds nothing
      const float* src = part_o + (row0 + (int64_t)s * p.H) * kD + col0;
#pragma unroll
      for (int jn = 0; jn < 32; ++jn) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(src + 8 * jn));
        acc[4 * jn + 2 * h] += w * v.x;
        acc[4 * jn + 2 * h + 1] += w * v.y;
      }
    }
    if (p.has_sink) l_f += exp2f(sink2 - mx);
    const bool has = l_f > 0.f;
    store_row_bf16(out + tok * p.stride_ot + (int64_t)head * p.stride_oh, acc, h, has ? 1.f / l_f : 0.f, col0);
    if (lse_writer) {
      float lv = has ? (mx + log2f(l_f)) * 0.6931471805599453f : -INFINITY;
      if (p.has_sink && m_valid == -INFINITY) lv = sink_h;
      lse[tok * p.stride_lt + (int64_t)head * p.stride_lh] = lv;
    }
  }
}

// VEC (FP8 only): the fp8v tile path (vec_load / vec_store) instead of issue_tile<true> + dequant_tile; same bits.
template <bool FP8, bool VEC = false>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_decode_kernel(const __nv_bfloat16* __restrict__ q, const uint8_t* __restrict__ kv,
                         const int* __restrict__ idx, const uint8_t* __restrict__ kv2, const int* __restrict__ idx2,
                         const float* __restrict__ sink, __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                         float* __restrict__ part_o, float* __restrict__ part_lse, int* __restrict__ counters,
                         Params p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Dynamic shared memory is only 16-byte aligned by contract: align to 1 KiB (the swizzle atom) by hand.
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* s_rows = reinterpret_cast<uint64_t*>(smem + Smem::small(FP8));  // [2][64] row addresses per stage
  float* s_red = reinterpret_cast<float*>(s_rows + 128);                     // [2][64] per-warpgroup row max / sum
  int* s_flag = reinterpret_cast<int*>(s_red + 128);

  // PDL (merge == 1): let the combine grid start on the idle SMs now; it waits in griddepcontrol.wait until this
  // grid has finished and its writes are visible. A no-op when no dependent launch follows.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  const int tid = threadIdx.x, wg = tid >> 7, t128 = tid & 127, warp = t128 >> 5, lane = tid & 31;
  const int num_hb = (p.H + kH - 1) / kH;
  const int hb = blockIdx.x % num_hb;
  const int split = (blockIdx.x / num_hb) % p.num_splits;
  const int64_t tok = blockIdx.x / (num_hb * p.num_splits);
  const int n_tiles = (p.topk + p.topk2 + kBN - 1) / kBN;
  const int lo = split * p.tiles_per_split;
  const int hi = min(lo + p.tiles_per_split, n_tiles);
  const int* idx_row = idx + tok * p.stride_it;
  const int* idx2_row = idx2 + tok * p.stride_it2;
  if (p.prefetch_ahead > 0 && split == 0) prefetch_token(p, q, idx, idx2, tok, hb, tid);

  // Q [64 heads, 512] -> swizzled smem (cp.async group 0, together with the first tile); heads >= H read as 0.
  {
    const __nv_bfloat16* qt = q + tok * p.stride_qt + (int64_t)hb * kH * p.stride_qh;
    const int h_in = min(kH, p.H - hb * kH);
    uint32_t base = smem_u32(smem + Smem::q);
    int c = tid & 63;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      int r = (tid >> 6) + 4 * i;
      cp_async16(base + swz(r, c, kH), qt + (int64_t)(r < h_in ? r : 0) * p.stride_qh + c * 8, r < h_in);
    }
  }
  if (tid < 64) s_rows[tid] = lo < hi ? load_row(p, kv, idx_row, kv2, idx2_row, lo * kBN + tid) : 0ull;
  __syncthreads();
  static_assert(FP8 || !VEC, "fp8v needs the FP8 cache");
  VecRegs vr;  // VEC: the tile being loaded (registers)
  const VecMap vm{tid / 28, tid % 28};
  if constexpr (VEC) {
    if (lo < hi) vec_load(vr, s_rows, vm, tid);
  } else if (lo < hi) {
    issue_tile<FP8>(smem, 0, s_rows, kv, tid);
  }
  cp_commit();
  if (tid < 64) s_rows[64 + tid] = load_row(p, kv, idx_row, kv2, idx2_row, (lo + 1) * kBN + tid);

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max (base 2) of rows r0 = 16 warp + lane / 4, r1 = r0 + 8
  float l_run[2] = {0.f, 0.f};              // this thread's partial row sums (its 8 columns per tile)
  const int r0 = warp * 16 + (lane >> 2);

  for (int t = lo; t < hi; ++t) {
    const int j = t - lo, st = j & 1;
    uint64_t next_row = 0;  // row of tile t + 2 for thread tid < 64, loaded early to hide its latency
    if (tid < 64) next_row = load_row(p, kv, idx_row, kv2, idx2_row, (t + 2) * kBN + tid);
    // (A) s_rows[st ^ 1] written; the previous tile's buffers are free; does tile t have any valid row?
    const int any_valid = __syncthreads_or(tid < 64 && s_rows[64 * st + tid] != 0);
    if (!VEC && t + 1 < hi) issue_tile<FP8>(smem, st ^ 1, s_rows + 64 * (st ^ 1), kv, tid);
    cp_commit();
    cp_wait1();  // this thread's copies of tile t (and Q) have landed
    if constexpr (VEC) {
      // (A) also freed the bf16 tile (both warpgroups' P @ V of tile t - 1 are done): convert straight into it
      // (an all-hole tile: nothing to store), then put tile t + 1's loads in flight behind this tile's math
      // (s_rows[st ^ 1] was written before (A)). One copy of the load block for both paths (code size).
      if (any_valid) vec_store(smem, vr, vm, tid);
      if (t + 1 < hi) vec_load(vr, s_rows + 64 * (st ^ 1), vm, tid);
    }
    if (!any_valid) {  // all holes (CTA-uniform): the tile would change nothing, skip its math
      if (tid < 64) s_rows[64 * st + tid] = next_row;  // nobody reads s_rows[st] after (A) on this path
      continue;
    }
    if constexpr (FP8 && !VEC) {
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
    const uint64_t dq = gmma_desc(q_base, 16, 1024), dk = gmma_desc(kv_base + wg * 32 * 128, 16, 1024);
#pragma unroll
    for (int ks = 0; ks < 32; ++ks) {
      const uint32_t koff = (ks >> 2) * kSub + (ks & 3) * 32;  // sub-tile, then 16 dims = 32 B inside the row
      wgmma_m64n32k16_kk(s, desc_at(dq, koff), desc_at(dk, koff), 1);
    }
    wg_commit();
    wg_wait0();
    reg_fence<16>(s);

    // ---- online softmax (base 2). Thread holds s[4 j + {0,1}] at (r0, col), s[4 j + {2,3}] at (r0 + 8, col),
    // col = 32 wg + 8 j + 2 (lane % 4) + {0, 1}.
    const uint64_t* rows_t = s_rows + 64 * st;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 32 * wg + 8 * jj + 2 * (lane & 3) + e;
        const bool ok = rows_t[col] != 0;
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
    const uint64_t dp = gmma_desc(p_base, 16, 1024), dv = gmma_desc(kv_base + 4 * wg * kSub, kSub, 1024);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_m64n256k16_tb(acc, desc_at(dp, ks * 32), desc_at(dv, ks * 16 * 128), 1);
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
  const bool lse_writer = wg == 0 && (lane & 3) == 0;
  if (p.num_splits == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = hb * kH + r0 + 8 * h;
      if (head >= p.H) continue;
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
      store_row_bf16(out + tok * p.stride_ot + (int64_t)head * p.stride_oh, acc, h, has ? a / l_f : 0.f, col0);
      if (lse_writer) {
        float lv = has ? (m_f + log2f(l_f)) * 0.6931471805599453f : -INFINITY;
        if (p.has_sink && m == -INFINITY) lv = sink_h;
        lse[tok * p.stride_lt + (int64_t)head * p.stride_lh] = lv;
      }
    }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = hb * kH + r0 + 8 * h;
    if (head >= p.H) continue;
    const bool has = l_tot[h] > 0.f;
    const float so = has ? 1.f / l_tot[h] : 0.f;
    const int64_t prow = (tok * p.num_splits + split) * (int64_t)p.H + head;
    float* orow = part_o + prow * kD;
#pragma unroll
    for (int jn = 0; jn < 32; ++jn) {
      *reinterpret_cast<float2*>(orow + col0 + 8 * jn) =
          make_float2(acc[4 * jn + 2 * h] * so, acc[4 * jn + 2 * h + 1] * so);
    }
    if (lse_writer) part_lse[prow] = has ? m_run[h] + log2f(l_tot[h]) : -INFINITY;
  }
  if (p.merge != 2) return;
  // Last CTA merges (threadFenceReduction pattern): publish this split's partial, count it, and let the CTA that
  // brings the count to num_splits read the others' (bypassing L1) and finish the token.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    int* ctr = counters + tok * num_hb + hb;
    const int last = atomicAdd(ctr, 1) == p.num_splits - 1;
    if (last) *ctr = 0;  // every split has counted: reset for the next launch (stream order)
    *s_flag = last;
  }
  __syncthreads();
  if (*s_flag == 0) return;
  __threadfence();
  merge_last(acc, m_run, l_tot, part_o, part_lse, sink, out, lse, p, tok, hb, split, r0, col0, lse_writer);
}

// merge == 1: one warp per (token, head, 64 output dims), lane 2 dims; the Triton combine's math (weights
// 2^(lse_s - M), the sink in the denominator). Launched with PDL right after the attention kernel: it waits in
// griddepcontrol.wait for that grid's completion (and memory flush) instead of for its own launch.
__global__ void __launch_bounds__(256) combine_kernel(const float* __restrict__ part_o,
                                                      const float* __restrict__ part_lse,
                                                      const float* __restrict__ sink, __nv_bfloat16* __restrict__ out,
                                                      float* __restrict__ lse, Params p, int64_t num_tokens) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  CombineItem it;
  if (!combine_item(p, num_tokens, it)) return;
  const int64_t row0 = it.row0;
  const int S = p.num_splits;
  float m = -INFINITY;
  for (int s = 0; s < S; ++s) m = fmaxf(m, __ldcg(part_lse + row0 + (int64_t)s * p.H));
  const float m_valid = m;
  float sink_h, sink2;
  m = fold_sink(p, sink, it.head, m, sink_h, sink2);
  float l_f = 0.f;
  float2 a = make_float2(0.f, 0.f);
  const float* src = part_o + row0 * kD + it.chunk * 64 + 2 * it.lane;
#pragma unroll 4
  for (int s = 0; s < S; ++s) {
    const float w = exp2f(__ldcg(part_lse + row0 + (int64_t)s * p.H) - m);
    const float2 v = __ldcg(reinterpret_cast<const float2*>(src + (int64_t)s * p.H * kD));
    l_f += w;
    a.x += w * v.x;
    a.y += w * v.y;
  }
  combine_store(p, it, a, l_f, m, m_valid, sink_h, sink2, out, lse);
}

static int launch_combine(const LaunchArgs& a, cudaStream_t stream) {
  const int64_t blocks = a.num_tokens * a.p.H;  // 8 warps = 8 (head, 64-dim) items per CTA, 8 items per head
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks);
  cfg.blockDim = dim3(256);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (a.p.merge == 3) return launch_combine_wide(a, &cfg);  // fm_combine_wide.cu
  return (int)cudaLaunchKernelEx(&cfg, combine_kernel, reinterpret_cast<const float*>(a.part_o),
                                 reinterpret_cast<const float*>(a.part_lse), reinterpret_cast<const float*>(a.sink),
                                 reinterpret_cast<__nv_bfloat16*>(a.out), reinterpret_cast<float*>(a.lse), a.p,
                                 a.num_tokens);
}

template <bool FP8, bool VEC = false>
static int launch_impl(const LaunchArgs& a, cudaStream_t stream) {
  const int smem = Smem::total(FP8) + 1024;  // + alignment slack (VEC leaves the raw staging area unused)
  auto kern = sparse_decode_kernel<FP8, VEC>;
  // Set on every launch (cheap): a static "done" flag would be shared by both instances (see NOTES, deep_select).
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return (int)e;
  const Params& p = a.p;
  const int64_t grid = a.num_tokens * p.num_splits * ((p.H + kH - 1) / kH);
  if (grid <= 0) return 0;
  kern<<<(unsigned)grid, kThreads, smem, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(a.q), reinterpret_cast<const uint8_t*>(a.kv),
      reinterpret_cast<const int*>(a.idx), reinterpret_cast<const uint8_t*>(a.kv2),
      reinterpret_cast<const int*>(a.idx2), reinterpret_cast<const float*>(a.sink),
      reinterpret_cast<__nv_bfloat16*>(a.out), reinterpret_cast<float*>(a.lse), reinterpret_cast<float*>(a.part_o),
      reinterpret_cast<float*>(a.part_lse), reinterpret_cast<int*>(a.counters), p);
  e = cudaGetLastError();
  if (e != cudaSuccess || p.num_splits == 1 || (p.merge != 1 && p.merge != 3)) return (int)e;
  return launch_combine(a, stream);
}

}  // namespace fm

int fm_launch_sparse_decode(const fm::LaunchArgs& a, int kv_mode, uintptr_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (kv_mode == 2) return fm::launch_impl<true, true>(a, s);
  return kv_mode == 1 ? fm::launch_impl<true>(a, s) : fm::launch_impl<false>(a, s);
}

const char* fm_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

int fm_smem_bytes(bool fp8) { return fp8 ? fm::Smem::total(true) + 1024 : fm::Smem::total(false) + 1024; }
