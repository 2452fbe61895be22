// FP8 block-scaled M-grouped GEMM with double-buffered promotion ("fp8_db", sm_90a; issue 6).
//
// out[r, n] (bf16) = sum over 128-deep k blocks kb of sfa[r, kb] * sfb[grp, n / 128, kb] * (A[r, kb] . B[grp, n, kb])
// for the rows r of group grp (contiguous layout: offs = cumulative row ends; dense = one group). Same semantics as
// reference.fp8_gemm_nt / m_grouped_fp8_gemm_nt_contiguous. Operands: A e4m3 [m, k] row major, sfa fp32 [m, k / 128],
// B e4m3 [g, n, k] (K-major), sfb fp32 [g, n / 128, k / 128], out bf16 [m, n]; k % 128 == 0, n % 128 == 0.
//
// CTA: 384 threads, tile 128 (rows) x 128 (n), persistent (gridDim.x CTAs walk the tiles of all groups).
//   warpgroup 0 (producer, setmaxnreg 24): cp.async 16-byte copies of k-block lp's A tile, B tile (128-byte swizzle,
//     as gmma_desc) and its 128 A scales + 1 B scale into ring stage lp % S, after the consumers released it (empty
//     mbarrier, one arrive per consumer warp); completion arrives on full[stage] by cp.async.mbarrier.arrive.noinc
//     (each producer thread's copies), so the producer never waits for its own copies and runs S blocks ahead. The
//     consumers fence the async proxy after the full wait (the wgmma reads what cp.async wrote).
//   warpgroups 1, 2 (consumers, setmaxnreg 240): rows 64 cw .. 64 cw + 63 of the tile, m64n128k32 e4m3 wgmmas.
//
// THE POINT (the CUTLASS collective waits for each block's wgmmas before promoting): each consumer keeps TWO
// temporary accumulator sets. Block b's four wgmmas go into tmp[b & 1] (scale-d 0 first, write-only operands), commit;
// then the scales of block b - 1 are read from its stage, `wgmma.wait_group 1` (block b - 1 done, block b still
// running), acc += tmp[(b - 1) & 1] * (sa * sb), stage b - 1 released. So the tensor pipe always has the next block
// queued while the FFMAs run. The k loop is unrolled by two so both tmp sets are named arrays, and every wait's group
// count is a compile-time constant on every path (else ptxas serialises the wgmmas: C7514 / C7518).
//
// Tile boundaries drain (wait_group 0) before the epilogue: with a wgmma in flight across the epilogue ptxas needs
// acc + both temporaries + the epilogue's registers and spilled ~260 bytes (tried: flat loop over all tiles' blocks,
// and the next tile's first block issued before the stores). Cost: one promotion + epilogue per tile (~k / 128 blocks).
//
// Epilogue: acc -> bf16 pairs into a per-warpgroup shared staging tile (row stride 272 bytes: conflict-free), then
// 16-byte coalesced stores; rows past the group end are never stored (n % 128 == 0: no column tail).
//
// The TMA-fed kernels (fp8_db_tma_kernel and the 128 x 256 tile fp8_wide_kernel) live in dg_fp8_tma.cuh.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dg_w4a8_grouped.cuh"  // smem_u32, gmma_desc, cp_async16 / 4, wg_* fences, reg_fence, group_rows, build_prefix
#include "dg_w4a8_wgmma.cuh"    // wgmma_m64n128k32_e4m3
#include "dg_w4a8_ws.cuh"       // mbar_init / mbar_arrive / mbar_wait (with the 2^30-poll watchdog)

namespace dg_fp8db {

using dg_w4a8::build_prefix;
using dg_w4a8::cp_async16;
using dg_w4a8::cp_async4;
using dg_w4a8::gmma_desc;
using dg_w4a8::group_rows;
using dg_w4a8::mbar_arrive;
using dg_w4a8::mbar_init;
using dg_w4a8::mbar_wait;
using dg_w4a8::reg_fence;
using dg_w4a8::smem_u32;
using dg_w4a8::wg_arrive;
using dg_w4a8::wg_commit;
using dg_w4a8::wg_wait0;
using dg_w4a8::wgmma_m64n128k32_e4m3;

constexpr int kBM = 128, kBN = 128, kBK = 128;
constexpr int kThreads = 384;
constexpr int kMaxGroups = 4096;  // the per-group tile prefix lives in shared memory
constexpr int kPanel = 16;        // tile raster: panels of 16 m tiles x all n tiles (an L2-sized slab of A and B)
constexpr int kStgLd = 136;       // bf16 per staging row (272 bytes: the 8 rows of a bf16x2 store hit 8 bank quads)

template <int kStages>
struct DbLayout {
  static constexpr int kA = 0;                      // e4m3 [128, 128], 128-byte swizzle
  static constexpr int kB = kBM * kBK;              // e4m3 [128, 128], 128-byte swizzle
  static constexpr int kSA = kB + kBN * kBK;        // fp32 [128] A scales of the block
  static constexpr int kSB = kSA + kBM * 4;         // fp32 B scale of the block
  static constexpr int kStage = (kSB + 16 + 1023) / 1024 * 1024;
  static constexpr int kStg = kStages * kStage;     // bf16 [2][64][kStgLd] epilogue staging
  static constexpr int kBar = kStg + 2 * 64 * kStgLd * 2;  // uint64 full[S], empty[S]
  static constexpr int kScan = kBar + 16 * kStages;        // int [32] scan scratch
  static constexpr int kPrefix = kScan + 128;              // int [g + 1]
  static constexpr int bytes(int g) { return kPrefix + 4 * (g + 1) + 1024; }  // + 1 KiB alignment slack
};

struct DbParams {
  const uint8_t* a;          // e4m3 [m, k]
  const float* sfa;          // [m, k / 128]
  const uint8_t* b;          // e4m3 [g, n, k]
  const float* sfb;          // [g, n / 128, k / 128]
  const int* offs;           // [g] cumulative row ends
  __nv_bfloat16_raw* out;    // [m, n]
  int m, n, k, g;
};

// ------------------------------------------------------------------------------------------------ wgmma
// The first k32 step of a block: D = A * B (scale-d 0) with WRITE-ONLY register operands ("=f"), so the previous
// contents of D are dead before it. (The "+f" wrapper of dg_w4a8_wgmma.cuh would keep D live around the whole
// pipelined loop: acc + both temporaries + the epilogue's registers then exceed the consumer's budget and ptxas
// serialises the wgmmas, C7512.)
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_first(float* d, uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}

// ------------------------------------------------------------------------------------------------ mbarriers

// Arrives on `bar` once every cp.async this thread issued so far has landed (no pending-count increment: the
// barrier's expected count includes these arrivals).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Named barrier of one consumer warpgroup (ids 2, 3; 128 threads): the epilogue staging tile.
__device__ __forceinline__ void wg_sync(int cw) {
  if (cw == 0) {
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 3, 128;\n" ::: "memory");
  }
}

// ------------------------------------------------------------------------------------------------ tile schedule

struct DbTile {
  int grp, row0, rend, n0;  // rows [row0, min(row0 + 128, rend)), B rows [n0, n0 + tile width) of group grp
};

// Tile t (t < prefix[g]): its group by binary search of the tile prefix, then within the group panels of kPanel m
// tiles: all n tiles of a panel before the next panel, m fastest within the panel (concurrent CTAs share B tiles and
// a panel's A rows stay in L2).
// kTileN: the tile width (kBN; 256 for fp8_wide_kernel).
template <int kTileN = kBN>
__device__ __forceinline__ DbTile db_decode(int t, const int* prefix, const DbParams& p, int n_tiles) {
  int lo = 0, hi = p.g - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= t) lo = mid; else hi = mid - 1;  // clang-format: keep
  }
  const int2 rows = group_rows(p.offs, lo, p.m);
  const int m_tiles = (rows.y + kBM - 1) / kBM;
  const int local = t - prefix[lo];
  const int panel = local / (kPanel * n_tiles);
  const int pm = min(kPanel, m_tiles - panel * kPanel);  // m tiles of this panel
  const int r = local - panel * kPanel * n_tiles;
  DbTile tile;
  tile.grp = lo;
  tile.row0 = rows.x + (panel * kPanel + r % pm) * kBM;
  tile.rend = rows.x + rows.y;
  tile.n0 = (r / pm) * kTileN;
  return tile;
}

struct DbCursor {
  DbTile tile;
  int t, kb;  // local tile index of this CTA, k block
};

template <int kTileN = kBN>
__device__ __forceinline__ void db_next(DbCursor& c, const DbParams& p, const int* prefix, int my_tiles, int kblocks,
                                        int n_tiles) {
  if (++c.kb == kblocks) {
    c.kb = 0;
    ++c.t;
    if (c.t < my_tiles) c.tile = db_decode<kTileN>(blockIdx.x + c.t * gridDim.x, prefix, p, n_tiles);
  }
}

// ------------------------------------------------------------------------------------------------ producer

// Stage `st` <- k block kb of `tile` (producer thread ptid of 128). A rows past the group end read as zeros (their
// scale too); they are never stored.
__device__ __forceinline__ void db_load(const DbParams& p, uint8_t* st, const DbTile& tile, int kb, int ptid, int ks) {
  const uint32_t a_dst = smem_u32(st), b_dst = smem_u32(st + kBM * kBK);
  const int c = ptid & 7, r_base = ptid >> 3;  // 16-byte chunk c of rows r_base + 16 i
  const size_t kofs = (size_t)kb * kBK + c * 16;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = r_base + 16 * i, row = tile.row0 + r;
    const bool ok = row < tile.rend;
    cp_async16(a_dst + r * 128 + ((c ^ (r & 7)) << 4), p.a + (size_t)(ok ? row : 0) * p.k + kofs, ok);
  }
  const uint8_t* b_src = p.b + ((size_t)tile.grp * p.n + tile.n0) * p.k + kofs;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = r_base + 16 * i;
    cp_async16(b_dst + r * 128 + ((c ^ (r & 7)) << 4), b_src + (size_t)r * p.k, true);
  }
  {
    const int row = tile.row0 + ptid;
    const bool ok = row < tile.rend;
    cp_async4(smem_u32(st + DbLayout<4>::kSA + 4 * ptid), p.sfa + (size_t)(ok ? row : 0) * ks + kb, ok);
  }
  if (ptid == 0) {
    const size_t sb_row = (size_t)tile.grp * (p.n / kBN) + tile.n0 / kBN;
    cp_async4(smem_u32(st + DbLayout<4>::kSB), p.sfb + sb_row * ks + kb, true);
  }
}

template <int kStages>
__device__ void db_producer(const DbParams& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                            int n_tiles) {
  using L = DbLayout<kStages>;
  const int ptid = threadIdx.x, ks = p.k / kBK;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kStages;
  const int steps = my_tiles * kblocks;
  DbCursor c;
  c.tile = db_decode(blockIdx.x, prefix, p, n_tiles);
  c.t = c.kb = 0;
  for (int lp = 0; lp < steps; ++lp) {
    const int s = lp % kStages;
    if (lp >= kStages) mbar_wait(&empty[s], (uint32_t)((lp / kStages - 1) & 1));
    db_load(p, smem + s * L::kStage, c.tile, c.kb, ptid, ks);
    mbar_arrive_cp_async(&full[s]);
    db_next(c, p, prefix, my_tiles, kblocks, n_tiles);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no thread exits with copies in flight
}

// ------------------------------------------------------------------------------------------------ consumers

// Wait for block sp's stage and issue its four wgmmas into t (scale-d 0 on the first: t needs no zeroing).
// kSpin: a plain spin instead of mbar_wait's watchdog (benchmarks/ceiling/wgmma_ceiling.cu: with the watchdog's
// counter and trap path these consumers spilled there; the kernels keep the watchdog).
template <int kStages, bool kSpin = false>
__device__ __forceinline__ void db_issue(float* t, uint8_t* smem, int sp, int cw) {
  using L = DbLayout<kStages>;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  const int stage = sp % kStages;
  if constexpr (kSpin) {
    while (!dg_w4a8::mbar_try_wait(&full[stage], (uint32_t)((sp / kStages) & 1))) {
    }
  } else {
    mbar_wait(&full[stage], (uint32_t)((sp / kStages) & 1));
  }
  fence_async_smem();  // cp.async (generic proxy) writes -> the wgmma's async-proxy reads
  const uint32_t st = smem_u32(smem + stage * L::kStage);
  const uint32_t a_base = st + cw * 64 * 128, b_base = st + L::kB;
  wg_arrive();
  wgmma_m64n128k32_e4m3_first(t, gmma_desc(a_base), gmma_desc(b_base));
#pragma unroll
  for (int j = 1; j < 4; ++j) wgmma_m64n128k32_e4m3(t, gmma_desc(a_base + 32 * j), gmma_desc(b_base + 32 * j), 1);
  wg_commit();
}

// acc[i] += t[i] * s(row of i): the thread holds rows r0 ([4 j + {0, 1}]) and r0 + 8 ([4 j + {2, 3}]).
__device__ __forceinline__ void db_promote(float* acc, const float* t, float s0, float s1) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    acc[4 * j + 0] = fmaf(t[4 * j + 0], s0, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(t[4 * j + 1], s0, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(t[4 * j + 2], s1, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(t[4 * j + 3], s1, acc[4 * j + 3]);
  }
}

// acc -> bf16 via the warpgroup's staging tile -> 16-byte stores of the rows < rend; then acc = 0.
template <int kStages>
__device__ __forceinline__ void db_store(const DbParams& p, const DbTile& tile, float* acc, uint8_t* smem, int cw,
                                         int wtid) {
  using L = DbLayout<kStages>;
  __nv_bfloat16_raw* stg = reinterpret_cast<__nv_bfloat16_raw*>(smem + L::kStg) + cw * 64 * kStgLd;
  const int lane = wtid & 31, q = lane & 3, r = 16 * (wtid >> 5) + (lane >> 2);
  wg_sync(cw);  // the previous tile's staging reads are done
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * q;
    *reinterpret_cast<__nv_bfloat162*>(stg + r * kStgLd + col) = __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
    *reinterpret_cast<__nv_bfloat162*>(stg + (r + 8) * kStgLd + col) =
        __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
  }
  wg_sync(cw);
  // 64 rows x 16 chunks of 16 bytes, a row's 16 chunks by 16 consecutive threads (256 contiguous bytes).
  const int cc = wtid & 15, rows_left = tile.rend - (tile.row0 + 64 * cw);
  const __nv_bfloat16_raw* src = stg + (wtid >> 4) * kStgLd + 8 * cc;
  __nv_bfloat16_raw* dst = p.out + (size_t)(tile.row0 + 64 * cw + (wtid >> 4)) * p.n + tile.n0 + 8 * cc;
#pragma unroll
  for (int rr = wtid >> 4; rr < 64; rr += 8) {
    if (rr < rows_left) *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    src += 8 * kStgLd;
    dst += (size_t)8 * p.n;
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
}

// Promote block sp from t; kPending: a later block's wgmma group was committed after it (wait_group 1, else 0; a
// compile-time count: ptxas must see on every path which group the wait retires, or it serialises the wgmmas).
// The scales are read from the stage BEFORE the wait (their latency hides under the running wgmmas).
template <int kStages, bool kPending>
__device__ __forceinline__ void db_finish(float* acc, float* t, uint8_t* smem, int sp, int cw, int wtid) {
  using L = DbLayout<kStages>;
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kBar) + kStages;
  const int stage = sp % kStages;
  const uint8_t* st = smem + stage * L::kStage;
  const int r0 = 64 * cw + 16 * (wtid >> 5) + ((wtid & 31) >> 2);
  const float* sa = reinterpret_cast<const float*>(st + L::kSA);
  const float sb = *reinterpret_cast<const float*>(st + L::kSB);
  const float s0 = sa[r0] * sb, s1 = sa[r0 + 8] * sb;
  if constexpr (kPending) {
    wg_wait1();
  } else {
    wg_wait0();
  }
  reg_fence<64>(t);
  db_promote(acc, t, s0, s1);
  __syncwarp();
  if ((wtid & 31) == 0) mbar_arrive(&empty[stage]);  // this warp's wgmma reads and scale reads of the stage are done
}

// The k blocks sp0 .. sp0 + kblocks - 1 of one tile into acc, two blocks in flight: one commit group (ta's) is
// outstanding at the loop head on every path, so every wait retires a known group. Returns with nothing in flight.
template <int kStages, bool kSpin = false>
__device__ __forceinline__ void db_tile(float* acc, float* ta, float* tb, uint8_t* smem, int sp0, int kblocks, int cw,
                                        int wtid) {
  db_issue<kStages, kSpin>(ta, smem, sp0, cw);
  int kb = 0;
  for (; kb + 1 < kblocks; kb += 2) {  // ta holds block kb, tb block kb + 1
    db_issue<kStages, kSpin>(tb, smem, sp0 + kb + 1, cw);
    db_finish<kStages, true>(acc, ta, smem, sp0 + kb, cw, wtid);
    if (kb + 2 < kblocks) {
      db_issue<kStages, kSpin>(ta, smem, sp0 + kb + 2, cw);
      db_finish<kStages, true>(acc, tb, smem, sp0 + kb + 1, cw, wtid);
    } else {
      db_finish<kStages, false>(acc, tb, smem, sp0 + kb + 1, cw, wtid);
      return;
    }
  }
  db_finish<kStages, false>(acc, ta, smem, sp0 + kb, cw, wtid);  // odd block count (k = 128: this block only)
}

// kStagger > 0: consumer warpgroup 1 starts kStagger ns late, so the two warpgroups reach their tile-end drains at
// different times (the leader runs ahead up to the ring's slack) and one keeps the tensor pipe busy while the other
// drains and stores. Same products and promotion order: bit-equal to kStagger = 0.
template <int kStages, int kStagger>
__device__ void db_consumer(const DbParams& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                            int n_tiles) {
  const int wtid = threadIdx.x - 128 - 128 * ((threadIdx.x - 128) >> 7), cw = (threadIdx.x - 128) >> 7;
  float acc[64], ta[64], tb[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  if constexpr (kStagger > 0) {
    if (cw == 1) __nanosleep(kStagger);
  }
  for (int lt = 0; lt < my_tiles; ++lt) {
    const DbTile tile = db_decode(blockIdx.x + lt * gridDim.x, prefix, p, n_tiles);
    db_tile<kStages>(acc, ta, tb, smem, lt * kblocks, kblocks, cw, wtid);
    db_store<kStages>(p, tile, acc, smem, cw, wtid);  // nothing in flight: both temporaries' registers are free
  }
}

// ------------------------------------------------------------------------------------------------ the kernel

// Kernel prologue: thread 0 initialises the ring's mbarriers (full[s]: `arrivals`; empty[s] = full[S + s]: one arrive
// per consumer warp), every thread builds the tile prefix. Returns this CTA's tile count (0: nothing to do).
template <int kStages>
__device__ __forceinline__ int db_start(const DbParams& p, uint64_t* full, int* scan, int* prefix, int n_tiles,
                                        int arrivals) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], arrivals);
      mbar_init(&full[kStages + s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  build_prefix<kBM, kThreads>(prefix, scan, p.offs, p.g, p.m, n_tiles);
  const int total = prefix[p.g];
  return total > (int)blockIdx.x ? (total - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
}

template <int kStages, int kStagger = 0>
__global__ void __launch_bounds__(kThreads, 1) fp8_db_kernel(const DbParams p) {
  using L = DbLayout<kStages>;
  static_assert(kStages >= 3, "the ring needs >= 3 stages (two blocks in flight per consumer + one loading)");
  static_assert(L::kSA == DbLayout<4>::kSA && L::kSB == DbLayout<4>::kSB, "stage layout independent of kStages");
  extern __shared__ uint8_t smem_raw[];
  // Dynamic shared memory is only 16-byte aligned by contract: align to 1 KiB (the swizzle atom) by hand.
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x;
  int* prefix = reinterpret_cast<int*>(smem + L::kPrefix);
  const int n_tiles = p.n / kBN, kblocks = p.k / kBK;
  const int my_tiles = db_start<kStages>(p, reinterpret_cast<uint64_t*>(smem + L::kBar),
                                         reinterpret_cast<int*>(smem + L::kScan), prefix, n_tiles,
                                         128);  // full[s]: every producer thread's cp.async arrive
  if (my_tiles == 0) return;
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    db_producer<kStages>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    db_consumer<kStages, kStagger>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  }
}

}  // namespace dg_fp8db
