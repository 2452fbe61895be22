// TMA-fed kernels of the FP8 block-scaled GEMM (sm_90a; issue 6): fp8_db_tma_kernel (128 x 128 tiles, the consumers,
// promotion and epilogue of dg_fp8_db.cuh) and fp8_wide_kernel (128 x 256 tiles). Semantics, operands and the
// double-buffered consumers: dg_fp8_db.cuh.
//
// TMA variant (fp8_db_tma_kernel, "fp8_db_t5" / "fp8_db_t4"; session 9, opt-in): the cp.async producer was the limit
// (Nsight Compute: its 16 address computations per thread per block held the issue slots while the consumers waited
// on the full barrier). Here producer thread 0 issues per stage `mbarrier.arrive.expect_tx` (32 KiB) and two
// `cp.async.bulk.tensor.2d` copies (A box [128 rows, 128 k] of the [m, k] map, B box of the [g * n, k] map; 128-byte
// swizzle: the bytes the cp.async path writes, so gmma_desc and the consumers are unchanged) plus the B scale, and
// each of the 128 producer threads copies one A scale with cp.async4 (a tile's scales are strided in sfa: below
// TMA's 16-byte box minimum), arriving with .noinc as before: full[s] expects 128 + 1 arrivals and 32 KiB. (One
// producer warp doing 4 scales per lane spilled 12-16 bytes at setmaxnreg 24, and 24 is the most the 240-register
// consumers leave: 128 * 24 + 256 * 240 = 384 * 168.) A rows past m are zero-filled by TMA; rows past the group
// end but < m load the next group's bytes (the cp.async path loads zeros): their scales are still zero-filled and
// those rows are never stored (each output row depends on its A row only), so the stored output is bit-equal.
// Consumers, promotion, epilogue and tile order: shared code.
//
// WIDE variant (fp8_wide_kernel, "fp8_wide_t4" / "fp8_wide_t3", tma = 2; session 12; H200: bit-equal to fp8_db_t4 in
// every GPU test, 1.11-1.22x it, the API's dense kernel where `cuda_fp8_db.wide_rule` says: README). Why: fp8_db_t4 runs the tensor pipe at ~55 % while shared memory is at ~75 % (Nsight
// Compute): per 128-deep k block a 128 x 128 tile moves 48 KiB of wgmma operand reads + 32 KiB of TMA writes per 512
// tensor clocks, 160 B/clk against ~128 B/clk. A 128 x 256 tile moves 96 + 48 KiB per 1024 clocks (144 B/clk):
// the TMA bytes per FLOP drop by 25 %. Requires n % 256 == 0.
//   Producer (warpgroup 0, setmaxnreg 40): db_producer_tma<S, true>: per stage thread 0 expect_tx(48 KiB) + the A box
//     [128 rows, 128 k] + ONE B box [256 rows, 128 k] (a 256-row 128-byte-swizzled box is two 128-row boxes back to
//     back, the swizzle phase being row mod 8: n half h starts at B + h * 16 KiB, where gmma_desc expects it);
//     threads 0, 1 the two B scales, every thread one A scale by cp.async + .noinc arrive (as fp8_db_tma_kernel).
//   Consumers (warpgroups 1, 2, setmaxnreg 232): rows 64 cw .. 64 cw + 63, all 256 columns: acc[128] (n half h in
//     acc[64 h ..]) and ONE temporary t[64]. Per k block: full wait (no proxy fence: TMA wrote the operands), then for
//     each half its four m64n128k32 wgmmas into t, wait_group 0, acc half += t * (sa * sb[h]); then the stage is
//     released (one arrive per warp). Each output element sees the same four wgmmas over the same bytes and the same
//     fp32 promotion in the same k order as fp8_db_t4: bit-equal. The two warpgroups interleave on the tensor pipe
//     (one promotes while the other's wgmmas run); a second temporary (a group in flight across a promotion, as
//     fp8_db) would need 128 + 2 * 64 registers + addresses > 232: not possible at this tile width.
//   Registers: 128 * 40 + 256 * 232 = 64,512 = 384 * 168 (the launch share). ptxas: 0 spills, no C75xx warnings.
//   Epilogue: straight from registers (a quad-shuffle transpose gives each lane 8 contiguous bf16 of a row: 16-byte
//     stores, a warp writing whole 32-byte sectors), rows past the group end never stored. No staging tile: 4 stages
//     x 48 KiB + scales + barriers + the 4,097-int prefix (g = 4096) + 1 KiB alignment = 216,292 bytes of the 227 KiB,
//     leaving 16 KiB, less than two 64 x 128 bf16 staging halves (2 x 17 KiB). 3 stages: 166,604 bytes.
#pragma once
#include <cuda.h>  // CUtensorMap (the type only: no libcuda link)

#include <type_traits>

#include "dg_fp8_db.cuh"

namespace dg_fp8db {

// ------------------------------------------------------------------------------------------------ TMA variant

// Arrive once on `bar` and add `bytes` to the transaction count of its current phase (the TMA copies complete them).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
// The box of `map` ([128 or 256 rows, 128 k]) at (k0, row0) -> dst (1 KiB aligned, 128-byte swizzle); completes on
// `bar`.
__device__ __forceinline__ void tma_load_2d(uint8_t* dst, const CUtensorMap* map, int k0, int row0, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_prefetch(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The two tensor maps in ONE kernel parameter (__grid_constant__: read in place, never copied): the producer keeps one
// generic pointer for both (it runs in 24 registers after setmaxnreg).
struct DbMaps {
  CUtensorMap a;  // A [m, k]
  CUtensorMap b;  // B [g * n, k]
};

constexpr int kTmaArrivals = 128 + 1;  // full[s]: 128 producer threads' cp.async .noinc arrives + thread 0's expect_tx
constexpr uint32_t kTmaBytes = (kBM + kBN) * kBK;  // A + B boxes of one stage (e4m3: one byte each)

// Stage `st` <- k block kb of `tile` (producer thread ptid of 128): thread 0 the TMA copies (after expect_tx) and
// the B scale, thread ptid the A scale of row ptid (zero past the group end, as db_load). Then every thread arrives
// (.noinc).
__device__ __forceinline__ void db_load_tma(const DbParams& p, uint8_t* st, uint64_t* full, const DbTile& tile, int kb,
                                            int ptid, int ks, const DbMaps* maps) {
  if (ptid == 0) {
    mbar_arrive_expect_tx(full, kTmaBytes);
    tma_load_2d(st + DbLayout<4>::kA, &maps->a, kb * kBK, tile.row0, full);
    tma_load_2d(st + DbLayout<4>::kB, &maps->b, kb * kBK, tile.grp * p.n + tile.n0, full);
    const size_t sb_row = (size_t)tile.grp * (p.n / kBN) + tile.n0 / kBN;
    cp_async4(smem_u32(st + DbLayout<4>::kSB), p.sfb + sb_row * ks + kb, true);
  }
  {
    const int row = tile.row0 + ptid;
    const bool ok = row < tile.rend;
    cp_async4(smem_u32(st + DbLayout<4>::kSA + 4 * ptid), p.sfa + (size_t)(ok ? row : 0) * ks + kb, ok);
  }
  mbar_arrive_cp_async(full);
}

// fp8_wide_kernel's ring (top comment): stage s = A box [128, 128] + B box [256, 128] (n half h at kB + h * 16 KiB);
// the scales live outside the stages so a stage stays exactly 48 KiB (a 1 KiB multiple: every box swizzle-aligned).
template <int kStages>
struct WideLayout {
  static constexpr int kA = 0;                         // e4m3 [128, 128], 128-byte swizzle
  static constexpr int kB = kBM * kBK;                 // e4m3 [256, 128], 128-byte swizzle
  static constexpr int kStage = kB + 2 * kBN * kBK;    // 48 KiB
  static constexpr int kSA = kStages * kStage;         // fp32 [S][128] A scales
  static constexpr int kSB = kSA + kStages * kBM * 4;  // fp32 [S][2] B scales of the two n halves
  static constexpr int kBar = kSB + kStages * 8;       // uint64 full[S], empty[S]
  static constexpr int kScan = kBar + 16 * kStages;    // int [32] scan scratch
  static constexpr int kPrefix = kScan + 128;          // int [g + 1]
  static constexpr int bytes(int g) { return kPrefix + 4 * (g + 1) + 1024; }  // + 1 KiB alignment slack
};
static_assert(WideLayout<4>::bytes(kMaxGroups) <= 227 * 1024, "sm_90 opt-in shared memory limit (227 KiB)");
constexpr uint32_t kWideTmaBytes = (kBM + 2 * kBN) * kBK;  // A + B boxes of one wide stage

// Wide stage s <- k block kb of `tile`: as db_load_tma, with the 256-row B box (kWithB; the W4A8 wide kernel's
// producer writes B itself) and threads 0, 1 copying the B scales of n halves 0, 1 (rows n0 / 128 + h of sfb[grp]).
template <int kStages, bool kWithB = true>
__device__ __forceinline__ void wide_load_tma(const DbParams& p, uint8_t* smem, int s, const DbTile& tile, int kb,
                                              int ptid, int ks, const CUtensorMap* map_a, const CUtensorMap* map_b) {
  using L = WideLayout<kStages>;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar) + s;
  uint8_t* st = smem + s * L::kStage;
  if (ptid == 0) {
    mbar_arrive_expect_tx(full, kWithB ? kWideTmaBytes : kBM * kBK);
    tma_load_2d(st + L::kA, map_a, kb * kBK, tile.row0, full);
    if constexpr (kWithB) tma_load_2d(st + L::kB, map_b, kb * kBK, tile.grp * p.n + tile.n0, full);
  }
  if (ptid < 2) {
    const size_t sb_row = (size_t)tile.grp * (p.n / kBN) + tile.n0 / kBN + ptid;
    cp_async4(smem_u32(smem + L::kSB + 8 * s + 4 * ptid), p.sfb + sb_row * ks + kb, true);
  }
  const int row = tile.row0 + ptid;
  const bool ok = row < tile.rend;
  cp_async4(smem_u32(smem + L::kSA + (s * kBM + ptid) * 4), p.sfa + (size_t)(ok ? row : 0) * ks + kb, ok);
  mbar_arrive_cp_async(full);
}

// The TMA producer loop; kWide: fp8_wide_kernel's 128 x 256 tiles and stages (below), else fp8_db_tma_kernel's.
template <int kStages, bool kWide = false>
__device__ void db_producer_tma(const DbParams& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                                int n_tiles, const DbMaps* maps) {
  using L = std::conditional_t<kWide, WideLayout<kStages>, DbLayout<kStages>>;
  constexpr int kTileN = kWide ? 2 * kBN : kBN;
  const int ptid = threadIdx.x;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kStages;
  if (ptid == 0) {
    tma_prefetch(&maps->a);
    tma_prefetch(&maps->b);
  }
  const int steps = my_tiles * kblocks;
  DbCursor c;
  c.tile = db_decode<kTileN>(blockIdx.x, prefix, p, n_tiles);
  c.t = c.kb = 0;
  for (int lp = 0; lp < steps; ++lp) {
    const int s = lp % kStages;
    if (lp >= kStages) mbar_wait(&empty[s], (uint32_t)((lp / kStages - 1) & 1));
    if constexpr (kWide) {
      wide_load_tma<kStages>(p, smem, s, c.tile, c.kb, ptid, kblocks, &maps->a, &maps->b);
    } else {
      db_load_tma(p, smem + s * L::kStage, &full[s], c.tile, c.kb, ptid, kblocks, maps);
    }
    db_next<kTileN>(c, p, prefix, my_tiles, kblocks, n_tiles);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no thread exits with copies in flight
}

// fp8_db_kernel with the TMA producer (top comment): maps.a = A [m, k], maps.b = B [g * n, k], uint8 maps with box
// [128, 128] and 128-byte swizzle (built by the launcher, dg_fp8_db.cu). Consumers as fp8_db_kernel<kStages, 0>.
template <int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_db_tma_kernel(const DbParams p, const __grid_constant__ DbMaps maps) {
  using L = DbLayout<kStages>;
  static_assert(kStages >= 3, "the ring needs >= 3 stages (two blocks in flight per consumer + one loading)");
  static_assert(L::kA % 1024 == 0 && L::kB % 1024 == 0 && L::kStage % 1024 == 0, "TMA 128-byte swizzle: 1 KiB");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // the swizzle atom (as fp8_db_kernel)
  const int tid = threadIdx.x;
  int* prefix = reinterpret_cast<int*>(smem + L::kPrefix);
  const int n_tiles = p.n / kBN, kblocks = p.k / kBK;
  const int my_tiles = db_start<kStages>(p, reinterpret_cast<uint64_t*>(smem + L::kBar),
                                         reinterpret_cast<int*>(smem + L::kScan), prefix, n_tiles, kTmaArrivals);
  if (my_tiles == 0) return;
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    db_producer_tma<kStages>(p, smem, prefix, my_tiles, kblocks, n_tiles, &maps);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    db_consumer<kStages, 0>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  }
}

// ------------------------------------------------------------------------------------------------ wide variant
// fp8_wide_kernel (top comment): 128 x 256 tiles, consumer warpgroup cw owns rows 64 cw .. 64 cw + 63, all 256 columns.

// One n half's four m64n128k32 wgmmas into t as one commit group, as db_issue's but with the read-write ("+f")
// wrapper on all four, scale-d 0 on the first (D's old value ignored: the same products). With db_issue's write-only
// first wgmma ptxas gave each n half's temporary its own registers (acc + two temporaries: 228 bytes spilled, still
// 80 at 256 registers); read-write operands tie both halves (and every block) to the one t.
__device__ __forceinline__ void wide_wgmma4(float* t, uint32_t a_base, uint32_t b_base) {
  wg_arrive();
#pragma unroll
  for (int j = 0; j < 4; ++j) wgmma_m64n128k32_e4m3(t, gmma_desc(a_base + 32 * j), gmma_desc(b_base + 32 * j), j > 0);
  wg_commit();
}

// k block sp (ring slot sp % S) of both n halves into acc[128] (half h: acc[64 h .. 64 h + 63]) through the one
// temporary t: the half's four wgmmas, wait, acc half += t * (sa * sb[h]); then the stage is released. No proxy fence
// after the full wait: the wgmma operands were written by TMA (the async proxy; complete_tx orders them before the
// phase flips) and the scales by cp.async, visible through the .noinc arrive, and are read with ordinary loads.
template <int kStages>
__device__ __forceinline__ void wide_block(float* acc, float* t, uint8_t* smem, int sp, int cw, int wtid) {
  using L = WideLayout<kStages>;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  const int stage = sp % kStages;
  const float* sa = reinterpret_cast<const float*>(smem + L::kSA) + stage * kBM;
  const float* sb = reinterpret_cast<const float*>(smem + L::kSB) + stage * 2;
  const uint32_t st = smem_u32(smem + stage * L::kStage);
  const int r0 = 64 * cw + 16 * (wtid >> 5) + ((wtid & 31) >> 2);
  mbar_wait(&full[stage], (uint32_t)((sp / kStages) & 1));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    wide_wgmma4(t, st + L::kA + cw * 64 * 128, st + L::kB + h * kBN * kBK);
    const float sbh = sb[h];
    const float s0 = sa[r0] * sbh, s1 = sa[r0 + 8] * sbh;  // as db_finish: the same fp32 products
    wg_wait0();
    reg_fence<64>(t);
    db_promote(acc + 64 * h, t, s0, s1);
  }
  __syncwarp();
  if ((wtid & 31) == 0) mbar_arrive(&full[kStages + stage]);  // empty[stage]: this warp's reads are done
}

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 4 x 4 transpose of 32-bit words across the 4 lanes of a quad (q = lane & 3): lane q ends with word q of every lane,
// in lane order. Two butterfly rounds (xor 2, then xor 1), each swapping two words with the partner; the word choices
// are selects, never a register array indexed by q (that would go to local memory).
__device__ __forceinline__ void quad_transpose(uint32_t* w, int q) {
  const bool hi = (q & 2) != 0, odd = (q & 1) != 0;
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi ? w[0] : w[2], 2);
  uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi ? w[1] : w[3], 2);
  w[0] = hi ? r0 : w[0];
  w[1] = hi ? r1 : w[1];
  w[2] = hi ? w[2] : r0;
  w[3] = hi ? w[3] : r1;
  r0 = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[1], 1);
  r1 = __shfl_xor_sync(0xffffffffu, odd ? w[2] : w[3], 1);
  w[0] = odd ? r0 : w[0];
  w[1] = odd ? w[1] : r0;
  w[2] = odd ? r1 : w[2];
  w[3] = odd ? w[3] : r1;
}

// acc -> bf16 straight from registers (no staging tile: the 4-stage ring leaves no room for one), then acc = 0.
// A lane holds, per 32-column group g (acc[16 g .. 16 g + 15]), bf16 pairs at columns 32 g + 8 i + 2 q of rows r and
// r + 8; after quad_transpose lane q holds the 8 contiguous columns 32 g + 8 q .. + 7 of each row: one 16-byte store
// per row, a warp's store covering 64 contiguous bytes of 8 rows (whole 32-byte sectors). Rows >= rend not stored.
__device__ __forceinline__ void wide_store(const DbParams& p, const DbTile& tile, float* acc, int cw, int wtid) {
  const int lane = wtid & 31, q = lane & 3;
  const int row = tile.row0 + 64 * cw + 16 * (wtid >> 5) + (lane >> 2);
  const bool ok0 = row < tile.rend, ok1 = row + 8 < tile.rend;
  __nv_bfloat16_raw* dst = p.out + (size_t)row * p.n + tile.n0 + 8 * q;
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    uint32_t w[4], x[4];  // rows r, r + 8
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = bf16x2_bits(acc[16 * g + 4 * i], acc[16 * g + 4 * i + 1]);
      x[i] = bf16x2_bits(acc[16 * g + 4 * i + 2], acc[16 * g + 4 * i + 3]);
    }
    quad_transpose(w, q);
    quad_transpose(x, q);
    if (ok0) *reinterpret_cast<uint4*>(dst + 32 * g) = make_uint4(w[0], w[1], w[2], w[3]);
    if (ok1) *reinterpret_cast<uint4*>(dst + (size_t)8 * p.n + 32 * g) = make_uint4(x[0], x[1], x[2], x[3]);
  }
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
}

template <int kStages>
__device__ void wide_consumer(const DbParams& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                              int n_tiles) {
  const int wtid = (threadIdx.x - 128) & 127, cw = (threadIdx.x - 128) >> 7;
  float acc[128], t[64];  // t: read by every wgmma ("+f"; scale-d 0 ignores it): defined once
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) t[i] = 0.f;
  for (int lt = 0; lt < my_tiles; ++lt) {
    const DbTile tile = db_decode<2 * kBN>(blockIdx.x + lt * gridDim.x, prefix, p, n_tiles);
    for (int kb = 0; kb < kblocks; ++kb) wide_block<kStages>(acc, t, smem, lt * kblocks + kb, cw, wtid);
    wide_store(p, tile, acc, cw, wtid);
  }
}

// The 128 x 256 tile kernel (top comment): maps.a = A [m, k] with box [128, 128], maps.b = B [g * n, k] with box
// [256, 128] (dg_fp8_db.cu). n % 256 == 0. Consumers at 232 registers: acc[128] + t[64] + addresses; the producer at
// 40 (128 * 40 + 256 * 232 = 384 * 168, the launch share).
template <int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_wide_kernel(const DbParams p, const __grid_constant__ DbMaps maps) {
  using L = WideLayout<kStages>;
  static_assert(kStages >= 2, "the ring needs one stage loading while the consumers read another");
  static_assert(L::kStage % 1024 == 0 && L::kB % 1024 == 0, "TMA 128-byte swizzle: 1 KiB aligned boxes");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // the swizzle atom (as fp8_db_kernel)
  const int tid = threadIdx.x;
  int* prefix = reinterpret_cast<int*>(smem + L::kPrefix);
  const int n_tiles = p.n / (2 * kBN), kblocks = p.k / kBK;
  const int my_tiles = db_start<kStages>(p, reinterpret_cast<uint64_t*>(smem + L::kBar),
                                         reinterpret_cast<int*>(smem + L::kScan), prefix, n_tiles, kTmaArrivals);
  if (my_tiles == 0) return;
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    db_producer_tma<kStages, true>(p, smem, prefix, my_tiles, kblocks, n_tiles, &maps);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    wide_consumer<kStages>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  }
}

}  // namespace dg_fp8db
