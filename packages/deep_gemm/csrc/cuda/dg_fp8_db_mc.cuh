// fp8_db with TMA multicast of B across a cluster of 2 CTAs ("fp8_db_m4" / "fp8_db_m5"; session 10, opt-in).
//
// Why: a 128x128 tile reads 32 KiB per 128-deep k block for 4.2 MFLOP, ~7.6 TB/s of L2->SM traffic at 1000 TFLOPS
// (Nsight Compute, session 10: fp8_db_t4 at 72 % L2 throughput). Two CTAs of a cluster take m tiles 2i and 2i + 1 of
// the same group and n tile ("pair tile") in lockstep: each TMA-loads its own A box [128 rows, 128 k] and HALF of
// the shared B box (rows 64 r .. 64 r + 63 for cluster rank r, box [64, 128]) multicast to both CTAs (ctaMask 0b11,
// same CTA-relative shared address: both CTAs align their dynamic shared memory identically). 24 KiB per CTA per
// block instead of 32.
//
// Protocol (on top of fp8_db_tma_kernel, dg_fp8_db.cuh):
//   full[s] (per CTA): 128 producer threads' cp.async .noinc arrivals (A scales) + thread 0's arrive.expect_tx of
//     32 KiB = own A 16 KiB + own B half 8 KiB + the peer's B half 8 KiB (the peer's complete_tx may land before the
//     local expect_tx: the phase cannot complete before the local arrivals anyway).
//   empty[s] (per CTA): 16 arrivals = 8 local consumer warps + 8 of the PEER's consumer warps (mapa +
//     mbarrier.arrive.release.cluster): this CTA's producer multicasts into the peer's copy of stage s, so it may only
//     refill s once both CTAs' consumers released it. Both CTAs walk the same (pair tile, k block) sequence, so stage
//     s's j-th phase is the same block in both.
//   Start: barrier.cluster after the barrier init (no remote arrive / multicast before the peer's init). End: the
//     producer waits for the release of the last kStages blocks (16 arrivals each, the peer's included), so no CTA
//     exits while its peer can still arrive on its barriers; the peer's multicasts into it are awaited by its own
//     consumers (full barriers).
// A pair's second m tile past the group end still loads (A rows of another group or row 0, scales zero-filled) and
// computes; its rows are never stored. Consumers, promotion and epilogue: fp8_db's, so the output is bit-equal to
// fp8_db_s5 / fp8_db_t4. Every wait is mbar_wait (a __trap after 2^30 polls: a protocol bug traps, never hangs).
// Grid: 2 * cudaOccupancyMaxActiveClusters CTAs (a cluster that could not be co-resident would run in a second wave).
#pragma once
#include "dg_fp8_db.cuh"

namespace dg_fp8db {

constexpr int kPairBM = 2 * kBM;         // rows of a pair tile
constexpr int kPairPanel = kPanel / 2;   // pair tiles per raster panel (the same 16 m tiles as fp8_db)
constexpr int kMcHalfRows = kBN / 2;     // B rows each CTA loads and multicasts
constexpr int kMcEmptyArrivals = 16;     // 8 local + 8 peer consumer warps

struct DbMapsMc {
  CUtensorMap a;       // A [m, k], box [128, 128]
  CUtensorMap b_half;  // B [g * n, k], box [64, 128]
};

// Not volatile: the compiler may re-read the special register instead of keeping it live (the producer has 24
// registers).
__device__ __forceinline__ int cluster_rank() {
  uint32_t r;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return (int)r;
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The box at (k0, row0) of `map` -> dst in every CTA of `mask` (same CTA-relative address); completes on each
// destination CTA's mbarrier at bar's CTA-relative address.
__device__ __forceinline__ void tma_load_2d_mc(uint8_t* dst, const CUtensorMap* map, int k0, int row0, uint64_t* bar,
                                               uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}

// Pair tile t of this CTA's cluster rank: db_decode with 256-row tiles (panels of kPairPanel pair tiles x all n tiles),
// then the rank's 128-row half.
__device__ __forceinline__ DbTile db_decode_pair(int t, const int* prefix, const DbParams& p, int n_tiles) {
  int lo = 0, hi = p.g - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= t) lo = mid; else hi = mid - 1;  // clang-format: keep
  }
  const int2 rows = group_rows(p.offs, lo, p.m);
  const int m_pairs = (rows.y + kPairBM - 1) / kPairBM;
  const int local = t - prefix[lo];
  const int panel = local / (kPairPanel * n_tiles);
  const int pm = min(kPairPanel, m_pairs - panel * kPairPanel);
  const int r = local - panel * kPairPanel * n_tiles;
  DbTile tile;
  tile.grp = lo;
  tile.row0 = rows.x + (panel * kPairPanel + r % pm) * kPairBM + cluster_rank() * kBM;
  tile.rend = rows.x + rows.y;
  tile.n0 = (r / pm) * kBN;
  return tile;
}

// Stage st <- k block kb of `tile`: thread 0 the expect_tx, its A box, its B half (multicast) and the B scale; thread
// ptid the A scale of row ptid (zero past the group end). A tile with no stored row loads A rows 0..127 (in bounds).
__device__ __forceinline__ void db_load_mc(const DbParams& p, uint8_t* st, uint64_t* full, const DbTile& tile, int kb,
                                           int ptid, int ks, const DbMapsMc* maps) {
  if (ptid == 0) {
    const int rank = cluster_rank();
    mbar_arrive_expect_tx(full, kTmaBytes);
    tma_load_2d(st + DbLayout<4>::kA, &maps->a, kb * kBK, tile.row0 < tile.rend ? tile.row0 : 0, full);
    tma_load_2d_mc(st + DbLayout<4>::kB + rank * kMcHalfRows * kBK, &maps->b_half, kb * kBK,
                   tile.grp * p.n + tile.n0 + rank * kMcHalfRows, full, 0x3);
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

template <int kStages>
__device__ void db_producer_mc(const DbParams& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                               int n_tiles, const DbMapsMc* maps) {
  using L = DbLayout<kStages>;
  const int ptid = threadIdx.x;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kStages;
  if (ptid == 0) {
    tma_prefetch(&maps->a);
    tma_prefetch(&maps->b_half);
  }
  const int steps = my_tiles * kblocks;
  DbTile tile = db_decode_pair(blockIdx.x >> 1, prefix, p, n_tiles);
  int t = 0, kb = 0;
  for (int lp = 0; lp < steps; ++lp) {
    const int s = lp % kStages;
    if (lp >= kStages) mbar_wait(&empty[s], (uint32_t)((lp / kStages - 1) & 1));
    db_load_mc(p, smem + s * L::kStage, &full[s], tile, kb, ptid, kblocks, maps);
    if (++kb == kblocks) {
      kb = 0;
      if (++t < my_tiles) tile = db_decode_pair((blockIdx.x >> 1) + t * (gridDim.x >> 1), prefix, p, n_tiles);
    }
  }
  // Tail: wait for the release of the last kStages blocks, i.e. for every arrival of the peer's consumers on this
  // CTA's empty barriers (CUTLASS's producer_tail): the CTA must not exit before them.
  for (int lp = steps; lp < steps + kStages; ++lp) {
    if (lp >= kStages) mbar_wait(&empty[lp % kStages], (uint32_t)((lp / kStages - 1) & 1));
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no thread exits with copies in flight
}

template <int kStages>
__device__ void db_consumer_mc(const DbParams& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                               int n_tiles) {
  const int wtid = threadIdx.x - 128 - 128 * ((threadIdx.x - 128) >> 7), cw = (threadIdx.x - 128) >> 7;
  float acc[64], ta[64], tb[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  for (int lt = 0; lt < my_tiles; ++lt) {
    const DbTile tile = db_decode_pair((blockIdx.x >> 1) + lt * (gridDim.x >> 1), prefix, p, n_tiles);
    db_tile<kStages, true>(acc, ta, tb, smem, lt * kblocks, kblocks, cw, wtid);
    db_store<kStages>(p, tile, acc, smem, cw, wtid);  // rows >= tile.rend (a pair's spare half) are never stored
  }
}

// Launched with cluster dimension (2, 1, 1) and an even grid (dg_fp8_db.cu). maps as DbMapsMc.
template <int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_db_mc_kernel(const DbParams p, const __grid_constant__ DbMapsMc maps) {
  using L = DbLayout<kStages>;
  static_assert(kStages >= 3, "the ring needs >= 3 stages (two blocks in flight per consumer + one loading)");
  static_assert(L::kB % 1024 == 0 && (kMcHalfRows * kBK) % 1024 == 0, "B halves: whole 128-byte swizzle atoms");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // same offset in both CTAs
  const int tid = threadIdx.x;
  int* prefix = reinterpret_cast<int*>(smem + L::kPrefix);
  const int n_tiles = p.n / kBN, kblocks = p.k / kBK;
  if (tid == 0) {
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], kTmaArrivals);
      mbar_init(&full[kStages + s], kMcEmptyArrivals);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  build_prefix<kPairBM, kThreads>(prefix, reinterpret_cast<int*>(smem + L::kScan), p.offs, p.g, p.m, n_tiles);
  cluster_sync_all();  // the peer's barriers are initialised before any multicast or remote arrive
  const int total = prefix[p.g], cid = (int)blockIdx.x >> 1, ncl = (int)gridDim.x >> 1;
  const int my_tiles = total > cid ? (total - 1 - cid) / ncl + 1 : 0;  // the same in both CTAs of the cluster
  if (my_tiles == 0) return;  // in both CTAs of the cluster: nothing remote happens
  // The roles end the kernel (no code after the if / else: a cluster barrier there made ptxas ignore the per-role
  // register budgets and spill ~700 bytes); the producer's tail keeps the CTA alive until the peer's last arrivals.
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    db_producer_mc<kStages>(p, smem, prefix, my_tiles, kblocks, n_tiles, &maps);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    db_consumer_mc<kStages>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  }
}

}  // namespace dg_fp8db
