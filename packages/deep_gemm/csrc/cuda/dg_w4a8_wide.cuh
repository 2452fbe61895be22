// W4A8 on fp8_wide's consumers (sm_90a; issue 6, session 13): FP8 e4m3 activations x FP4 e2m1 weights, M-grouped
// (offs layout), 128 x 256 tiles. Launcher: dg_fp8_db.cu (fp8_db_launch, tma = 4); weight format and its Python
// preparation: backends/cuda/w4a8_wide_pack.py.
//
// Why: the earlier W4A8 kernels (dg_w4a8_rs.cuh, 0.55-0.58x the FP8 grouped API) convert in the consumer warps,
// whose chains then wait on conversion and per-row promotion. Here the producer warpgroup converts and the consumers
// are fp8_wide's, unchanged (wide_consumer<3>: acc += t * (sa[row] * sb[n half]) once per 128-deep block), so the
// W4A8 GEMM runs the FP8 kernel's tensor-core loop and the conversion overlaps it in other warps.
//
// Weight format (prepared once per weight, w4a8_wide_pack.py): per 128 x 128 block the largest E8M0 byte E of its
// 128 rows x 4 groups of 32; each group's code c is stored for the e4m3 value c * 2^(6 - d), d = E - s (its own
// byte s), d in [0, 11], so every nonzero weight is a NORMAL e4m3 number (6 * 2^6 = 384 <= 448; 0.5 * 2^-5 = 2^-6)
// and the block scale sfb = 2^(E - 127 - 6) (fp32 [g, n / 128, k / 128], the FP8 kernel's B-scale layout). Exact:
// w = c * 2^(s - 127) = (c * 2^(6 - d)) * 2^(E - 133). Weights whose blocks span more than 11 binades (or hold the
// NaN byte 255) are not prepared for this kernel (the Python side keeps the exact kernels for them). Groups of zeros
// do not count towards E. Chunks: per (group, 256-row n tile, k block) 17,408 contiguous bytes: the 256 x 64 bytes
// of codes, row-major, each 32-bit word holding 8 codes in a permuted nibble order (below), then the 1,024 shift
// bytes d in producer-thread order (thread t's 8 at 16,384 + 8 t: byte i for rows 32 i + t / 4, group t % 4).
//
// Producer (warpgroup 0, setmaxnreg 56; consumers 224: 128 * 56 + 256 * 224 = 384 * 168), per k block lp (stage
// s = lp % 3, raw slot r = lp % 4):
//   - thread 0 keeps 2-4 chunks in flight: one bulk copy (cp.async.bulk, 17,408 bytes) per chunk into raw slot r,
//     completing on raw_full[r]; the A box by TMA and the scales by cp.async as fp8_wide (wide_load_tma without B).
//   - all 128 threads: wait raw_full[r], convert the slot into stage s's B tile (thread t: rows 32 i + t / 4, group
//     t % 4: one 16-byte load of 32 codes -> two swizzled 16-byte stores of e4m3, four groups per batch; a quarter
//     warp covers 8 distinct bank groups), fence.proxy.async (generic stores -> the wgmma's async-proxy reads),
//     arrive on full[s] and on raw_empty[r]; thread 0 then refills the slot of step lp - 1 with chunk lp + 3 once
//     raw_empty says every thread read it (no producer-wide barrier: session 13's ncu put 14 % of the producer's
//     stalls on one).
//   full[s] expects 128 cp.async .noinc arrivals (A scales) + thread 0's expect_tx + 128 conversion arrivals.
//   At most kW4MaxGroups = 1024 groups (its smaller prefix leaves room for 4 raw slots).
// Code word (8 codes k0..k7 of one row): nibble j (bits 4j..4j+3) = magnitude bits of k_j in bits 0..2 and, in bit 3,
// the sign of k_(j-1)/2 for odd j and of k_(4 + j/2) for even j. Then e4m3 bytes k0..k3 = prmt(T, w & 0x7777) | (w &
// 0x80808080) and k4..k7 = prmt(T, (w & 0x77777777) >> 16) | ((w << 4) & 0x80808080), T = the 8 magnitude bytes of
// shift d (w4_table: two IMADs): 7 instructions per 8 weights.
#pragma once
#include "dg_fp8_tma.cuh"

namespace dg_fp8db {

constexpr int kW4Stages = 3;                              // e4m3 ring (WideLayout<3>, the consumers' layout)
constexpr int kW4Raw = 4;                                 // raw chunk slots (bulk copies in flight)
constexpr int kW4MaxGroups = 1024;                        // a smaller prefix than kMaxGroups: room for 4 raw slots
constexpr int kW4Codes = 2 * kBN * kBK / 2;               // 16 KiB of codes of a [256, 128] B tile
constexpr int kW4Chunk = kW4Codes + 2 * kBN * 4;          // + 1 KiB of shift bytes = 17,408
constexpr int kW4MaxShift = 11;                           // largest d (every stored weight stays a normal e4m3)
constexpr int kW4Arrivals = 128 + 1 + 128;                // full[s]: A-scale cp.asyncs + expect_tx + conversions

// WideLayout<3> (stages, scales, barriers, prefix for kW4MaxGroups) followed by the raw slots and their barriers.
// Fixed size (the raw slots sit past the largest prefix).
struct W4Layout {
  using L = WideLayout<kW4Stages>;
  static constexpr int kRaw = (L::kPrefix + 4 * (kW4MaxGroups + 1) + 127) / 128 * 128;
  static constexpr int kRawBar = kRaw + kW4Raw * kW4Chunk;  // uint64 raw_full[kW4Raw], raw_empty[kW4Raw]
  static constexpr int kBytes = kRawBar + 16 * kW4Raw + 1024;  // + 1 KiB alignment slack
};
static_assert(W4Layout::kRaw % 128 == 0 && kW4Chunk % 128 == 0, "bulk copies: 16-byte aligned slots and sizes");
static_assert(W4Layout::kBytes <= 227 * 1024, "sm_90 opt-in shared memory limit (227 KiB)");

__device__ __forceinline__ void bulk_load(uint8_t* dst, const uint8_t* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint2 a, uint2 b) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a.x), "r"(a.y), "r"(b.x), "r"(b.y)
               : "memory");
}

// Before db_start (whose mbarrier fence and CTA barriers publish them): the raw barriers (thread 0): raw_full[r]
// one arrival (thread 0's expect_tx), raw_empty[r] the 128 producer threads (done reading the slot).
__device__ __forceinline__ void w4_init(uint8_t* smem) {
  if (threadIdx.x == 0) {
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + W4Layout::kRawBar);
    for (int r = 0; r < kW4Raw; ++r) {
      mbar_init(bars + r, 1);
      mbar_init(bars + kW4Raw + r, 128);
    }
  }
}

// Raw slot r <- the chunk of (tile, kb) (thread 0).
__device__ __forceinline__ void w4_raw_issue(const DbParams& p, uint8_t* smem, int r, const DbTile& tile, int kb,
                                             int kblocks) {
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + W4Layout::kRawBar) + r;
  const size_t chunk = ((size_t)tile.grp * (p.n / (2 * kBN)) + tile.n0 / (2 * kBN)) * kblocks + kb;
  mbar_arrive_expect_tx(bar, kW4Chunk);
  bulk_load(smem + W4Layout::kRaw + r * kW4Chunk, p.b + chunk * kW4Chunk, kW4Chunk, bar);
}

// prmt.b32 (default mode): byte j of the result = byte sel[4j + 2 : 4j] of {hi, lo}; sel[4j + 3] must be 0 (set,
// it sign-replicates). Inline asm: __byte_perm re-masks its selector with 0x7777 (one more op per call).
__device__ __forceinline__ uint32_t prmt(uint32_t lo, uint32_t hi, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(sel));
  return r;
}

// 8 codes (one permuted word, top comment) -> 8 e4m3 bytes (k0..k3, k4..k7) through the magnitude table t: 7 ops.
__device__ __forceinline__ uint2 w4_cvt8(uint32_t w, uint2 t) {
  const uint32_t mag = w & 0x77777777u;
  return make_uint2(prmt(t.x, t.y, mag) | (w & 0x80808080u), prmt(t.x, t.y, mag >> 16) | ((w << 4) & 0x80808080u));
}

// Magnitude table of shift d: e4m3 bytes of j * 2^(6 - d), j = 0, .5, 1, 1.5 | 2, 3, 4, 6. At d = 0 the nonzero
// ones are 0x60 .. 0x7c; every one stays normal for d <= 11 (exponent field >= 1), so shifting by d subtracts d from
// each nonzero byte's exponent field (bits 3..6) without borrows: two IMADs, no table lookup.
__device__ __forceinline__ uint2 w4_table(uint32_t d) {
  return make_uint2(0x6c686000u - d * 0x08080800u, 0x7c787470u - d * 0x08080808u);
}

// Raw slot r -> the e4m3 B tile at b_dst (256 rows x 128 bytes, 128-byte swizzle: 16-byte chunk c of row n at
// n * 128 + ((c ^ (n & 7)) << 4)). Thread t: rows 32 i + t / 4 (i = 0..7), group t % 4 = chunks 2 (t % 4), + 1.
// Four groups per batch: their 16-byte loads are in flight together (session 13, ncu of two-group batches: the
// producer waited on its shared loads; eight groups spill at 56 registers).
__device__ __forceinline__ void w4_convert(const uint8_t* raw, uint32_t b_dst, int ptid) {
  const uint2 dd = *reinterpret_cast<const uint2*>(raw + kW4Codes + 8 * ptid);  // shift of group i: byte i
  const int row0 = ptid >> 2, grp = ptid & 3;
  const uint32_t dst = b_dst + row0 * 128;
  const uint32_t c0 = ((2 * grp) ^ (row0 & 7)) << 4, c1 = ((2 * grp + 1) ^ (row0 & 7)) << 4;
#pragma unroll
  for (int i = 0; i < 8; i += 4) {
    uint4 w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = *reinterpret_cast<const uint4*>(raw + ((i + j) * 128 + ptid) * 16);
    const uint32_t dw = i < 4 ? dd.x : dd.y;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint2 t = w4_table((dw >> (8 * j)) & 15);
      st_shared_v4(dst + (i + j) * 32 * 128 + c0, w4_cvt8(w[j].x, t), w4_cvt8(w[j].y, t));
      st_shared_v4(dst + (i + j) * 32 * 128 + c1, w4_cvt8(w[j].z, t), w4_cvt8(w[j].w, t));
    }
  }
}

// The producer loop (top comment). No producer-wide barrier: each thread arrives on full[s] after its own fenced
// stores and on raw_empty[r] after its reads, and thread 0 refills the slot of step lp - 1 (usually released by then)
// with chunk lp - 1 + kW4Raw. cr: the chunk cursor (thread 0).
__device__ void w4_producer(const DbParams& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                            int n_tiles, const CUtensorMap* map_a) {
  using L = WideLayout<kW4Stages>;
  const int ptid = threadIdx.x;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kW4Stages;
  uint64_t* raw_full = reinterpret_cast<uint64_t*>(smem + W4Layout::kRawBar);
  uint64_t* raw_empty = raw_full + kW4Raw;
  const int steps = my_tiles * kblocks;
  DbCursor c, cr;
  c.tile = db_decode<2 * kBN>(blockIdx.x, prefix, p, n_tiles);
  c.t = c.kb = 0;
  cr = c;
  if (ptid == 0) {
    tma_prefetch(map_a);
    for (int j = 0; j < kW4Raw && j < steps; ++j) {
      w4_raw_issue(p, smem, j, cr.tile, cr.kb, kblocks);
      db_next<2 * kBN>(cr, p, prefix, my_tiles, kblocks, n_tiles);
    }
  }
  for (int lp = 0; lp < steps; ++lp) {
    const int s = lp % kW4Stages, r = lp % kW4Raw;
    if (lp >= kW4Stages) mbar_wait(&empty[s], (uint32_t)((lp / kW4Stages - 1) & 1));
    wide_load_tma<kW4Stages, false>(p, smem, s, c.tile, c.kb, ptid, kblocks, map_a, nullptr);  // A + scales
    mbar_wait(&raw_full[r], (uint32_t)((lp / kW4Raw) & 1));
    w4_convert(smem + W4Layout::kRaw + r * kW4Chunk, smem_u32(smem + s * L::kStage + L::kB), ptid);
    fence_async_smem();  // this thread's generic stores -> the consumers' wgmma (async proxy) reads
    mbar_arrive(&full[s]);
    mbar_arrive(&raw_empty[r]);
    const int refill = lp - 1 + kW4Raw;  // the chunk for raw slot (lp - 1) % kW4Raw
    if (ptid == 0 && lp >= 1 && refill < steps) {
      const int rp = (lp - 1) % kW4Raw;
      mbar_wait(&raw_empty[rp], (uint32_t)(((lp - 1) / kW4Raw) & 1));
      w4_raw_issue(p, smem, rp, cr.tile, cr.kb, kblocks);
      db_next<2 * kBN>(cr, p, prefix, my_tiles, kblocks, n_tiles);
    }
    db_next<2 * kBN>(c, p, prefix, my_tiles, kblocks, n_tiles);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no thread exits with copies in flight
}

// The W4A8 wide kernel: map_a = A [m, k] (box [128, 128], 128-byte swizzle; dg_fp8_db.cu), p.b = the chunks, p.sfb =
// the block scales [g, n / 128, k / 128]. n % 256 == 0. Registers 56 / 224 (fp8_wide_kernel: 40 / 232): the
// batched conversion (w4_convert) spills at 40; the consumers' acc[128] + t[64] fit in 224 without spills. static: a
// header kernel (tests/test_csrc_headers.py).
static __global__ void __launch_bounds__(kThreads, 1)
    w4a8_wide_kernel(const DbParams p, const __grid_constant__ CUtensorMap map_a) {
  using L = WideLayout<kW4Stages>;
  static_assert(L::kStage % 1024 == 0 && L::kB % 1024 == 0, "128-byte swizzle: 1 KiB aligned tiles");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x;
  int* prefix = reinterpret_cast<int*>(smem + L::kPrefix);
  const int n_tiles = p.n / (2 * kBN), kblocks = p.k / kBK;
  w4_init(smem);
  const int my_tiles = db_start<kW4Stages>(p, reinterpret_cast<uint64_t*>(smem + L::kBar),
                                           reinterpret_cast<int*>(smem + L::kScan), prefix, n_tiles, kW4Arrivals);
  if (my_tiles == 0) return;
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    w4_producer(p, smem, prefix, my_tiles, kblocks, n_tiles, &map_a);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    wide_consumer<kW4Stages>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  }
}

}  // namespace dg_fp8db
