// Warp-specialised sparse MLA decode/prefill kernel for sm_90a (wgmma, mbarriers, setmaxnreg), V4 shape: 64 heads x
// 512 dims per query token. Same math, split-KV format and hole rules as fm_sparse_decode.cu (the serial kernel); Python
// side backends/cuda/cuda_ws_decode.py.
//
// One CTA = one query token's 64 heads x one split of its index list; 384 threads = 3 warpgroups:
//   WG 2 (producer, setmaxnreg 72): gathers the indexed rows of the next tiles into a 4-stage ring of [32 keys, 512]
//     bf16 tiles (128-byte swizzle, 32 KiB each). BF16 cache: 16-byte cp.async straight into the ring, completion
//     signalled two tiles later (wait_group 2, proxy fence, mbarrier arrive) so three tiles are in flight. FP8 cache:
//     the 576 used bytes of each 584-byte row as 8-byte global loads into registers (a whole tile in flight: up to
//     24 loads per thread, 48 registers), the 7 UE8M0 scale bytes per row through shared memory, dequantised
//     e4m3 * 2^(s - 127) to bf16 (exact) and stored into the ring: the consumers only run wgmma. The register loads
//     are one synchronous round trip per tile, so the rows of the next tile are prefetched into L2 meanwhile.
//     full[stage] (128 producer arrivals) / empty[stage] (256 consumer arrivals) mbarrier pairs.
//   WG 0, 1 (consumers, setmaxnreg 216): warpgroup w owns output dims [256 w, 256 w + 256) (O [64, 256] fp32 = 128
//     registers per thread). Scores are split over d, not over keys: w computes the partial S_w = Q[:, dims_w]
//     K[:, dims_w]^T for all 32 keys of the tile (16 x wgmma m64n32k16), the partials are exchanged through shared
//     memory (double-buffered by tile parity, one 256-thread named barrier) and each warpgroup adds own + other;
//     IEEE addition commutes, so both hold bit-identical S and run the same online softmax (sink at the end) with
//     no row-max exchange. P stays in registers as the bf16 A operand of P @ V (wgmma m64n256k16, A from
//     registers): no P round trip through shared memory.
//   Why this split (registers): splitting keys (as fm_sparse_decode.cu does) needs the row max and P exchanged
//     through shared memory and one more barrier per tile; splitting d costs an 8 KiB fp32 exchange per warpgroup
//     per tile but lets P live in 8 registers, so S (16) + two P sets (16) + O (128) fit in 216 registers.
//   Overlap: in iteration i a consumer issues S_{i+1} (next tile) and P_i @ V_i back to back, waits for S_{i+1}
//     only, runs the softmax of tile i + 1 while P_i @ V_i is still on the tensor cores, then waits for it,
//     releases tile i's stage and rescales O.
// Shared memory: Q 64 KiB + ring 4 x 32 KiB + exchange 32 KiB + row ids / scale words / barriers: 226 KiB, one CTA
// per SM. Split-KV: split s of a token owns 32-row tiles [s * tiles_per_split, ...); num_splits == 1 writes out
// (bf16) and lse (natural log, sink included), else the fp32 partials acc / l and base-2 lse of
// triton_split_attn's _combine_kernel. Holes (any index outside [0, n_rows)): never read (zero row), score -inf.
//
// Variants from this one source (template flags, `variant` of fm_ws_launch): ws (as described above) and ws2 (the
// producer's BF16 full signal by cp.async.mbarrier.arrive, FP8 scale words loaded with the rows, O rescaled under the
// next tile's scores: see producer() and consumer()); plus timing-only ablation modes (enum Mode) of both.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "fm_ws_decode.h"
#include "fm_ws_wgmma.cuh"

namespace fm_ws {

constexpr int kH = 64;                  // heads per CTA (the wgmma M)
constexpr int kD = 512;                 // head dim
constexpr int kBN = 32;                 // KV rows per tile
constexpr int kStages = 4;              // ring depth
constexpr int kLag = kStages - 2;       // BF16: tile j signalled after tile j + kLag was issued (deadlock-free: < kStages - 1)
constexpr int kConsumers = 256;         // warpgroups 0, 1
constexpr int kThreads = 384;           // + producer warpgroup 2
constexpr int kProducerRegs = 72;
constexpr int kConsumerRegs = 216;
// setmaxnreg.inc only takes registers that .dec gave back: the totals must match the launch allocation (168 x 384).
static_assert(128 * kProducerRegs + kConsumers * kConsumerRegs <= 168 * kThreads, "setmaxnreg would deadlock");
constexpr int kQSub = 64 * 128;         // [64 rows, 64 bf16] swizzled sub-tile of Q: 8 KiB
constexpr int kKSub = kBN * 128;        // [32 rows, 64 bf16] sub-tile of a KV stage: 4 KiB
constexpr int kStageBytes = 8 * kKSub;  // [32, 512] bf16: 32 KiB
constexpr int kFp8Row = 584;
constexpr int kFp8RowsPerBatch = 8;    // FP8 rows per producer warp whose loads are in flight together (all 8)
constexpr int kBarConsumers = 1, kBarProducer = 2;      // named barriers (0 is __syncthreads)

struct Smem {
  static constexpr int q = 0;
  static constexpr int ring = 8 * kQSub;
  static constexpr int xchg = ring + kStages * kStageBytes;  // fp32 [2 parity][2 wg][16 regs][128 threads]
  static constexpr int rows = xchg + 2 * 2 * 16 * 128 * 4;    // int [kStages][32] row ids (-1: hole)
  static constexpr int scl = rows + kStages * kBN * 4;        // uint2 [kStages][32] FP8 scale words
  static constexpr int bars = scl + kStages * kBN * 8;        // uint64 full[kStages], empty[kStages]
  static constexpr int total = bars + 2 * kStages * 8;
};
static_assert(kBN == 32 && 8 % kFp8RowsPerBatch == 0, "the FP8 producer maps 4 warps x 8 rows in batches");
static_assert(Smem::total + 1024 <= 232448, "shared memory over the sm_90 opt-in limit");

// ------------------------------------------------------------------------------------------------ PTX helpers

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Byte offset of 16-byte chunk c (0..63) of row r in a [rows, 512] tile of 8 [rows, 64] sub-tiles, 128-byte swizzle
// (CUTLASS Swizzle<3,4,3>: chunk (c % 8) XOR (r % 8)), what wgmma's 128B mode reads.
__device__ __forceinline__ uint32_t swz(int r, int c, int rows) {
  return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// wgmma shared-memory descriptor, 128-byte swizzle: start >> 4, LBO >> 4 at bit 16, SBO >> 4 at bit 32, mode 1 at 62.
__device__ __forceinline__ uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = (uint64_t)((addr & 0x3FFFF) >> 4);
  d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
  d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
  d |= (uint64_t)1 << 62;
  return d;
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Ordinary / cp.async writes to shared memory that wgmma (the async proxy) reads next.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_arrive() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keep the compiler from moving register accesses across the wgmma waits (the hardware reads / writes them late).
template <int N>
__device__ __forceinline__ void reg_fence(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// ws2: the barrier arrival fires when every earlier cp.async of this thread has landed (no producer-side wait).
// .noinc: the arrival counts against the init count (128 producer threads), as CUTLASS's cpasync_barrier_arrive_noinc.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}
__device__ __forceinline__ void named_bar(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ int load_row_id(const int* idx_row, int pos, int topk, int64_t n_rows) {
  if (pos >= topk) return -1;
  const int v = __ldg(idx_row + pos);
  return (v >= 0 && (int64_t)v < n_rows) ? v : -1;
}

// The 5-6 L2 lines of one 584-byte row (8-byte aligned, so it may straddle one more line).
__device__ __forceinline__ void prefetch_fp8_row(const uint8_t* row) {
#pragma unroll
  for (int i = 0; i < 6; ++i) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + (i < 5 ? 128 * i : 583)));
}

__device__ __forceinline__ uint2 ldg_u2(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// 8 e4m3 bytes times scale -> 8 bf16 (exact: an e4m3 value times a power of two is a bf16 number).
__device__ __forceinline__ uint4 dequant8(uint2 b, float s) {
  const uint32_t w[2] = {b.x, b.y};
  uint32_t o[4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[h] >> (16 * k)), __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<__half2*>(&hr));
      __nv_bfloat162 bb = __floats2bfloat162_rn(f.x * s, f.y * s);
      o[2 * h + k] = *reinterpret_cast<uint32_t*>(&bb);
    }
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

// ------------------------------------------------------------------------------------------------ producer

// BF16 rows: thread t copies 16-byte chunk t % 64 of rows t / 64 + 2 i (holes zero-filled, never read).
__device__ __forceinline__ void issue_bf16_tile(uint8_t* stage, const int* rows, const uint8_t* kv, int64_t stride,
                                                int t) {
  const uint32_t base = smem_u32(stage);
  const int c = t & 63;
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) {
    const int r = (t >> 6) + 2 * i;
    const int row = rows[r];
    const uint8_t* src = kv + (int64_t)(row < 0 ? 0 : row) * stride + c * 16;
    cp_async16(base + swz(r, c, kBN), src, row >= 0);
  }
}

// FP8 rows: producer warp w fills rows 8 w .. 8 w + 7 of the tile, kFp8RowsPerBatch rows per batch whose loads are
// all issued before the first is used. Lane l reads the row's 8-byte units l, l + 32 and (l < 8) l + 64 (unit u:
// bytes 8u .. 8u + 7; e4m3 for u < 56, RoPE bf16 after): each load instruction of the warp is 256 contiguous bytes.
// Scale words (8 bytes at 576 per row) come through shared memory. Few per-thread invariants: no spills at kProducerRegs.
template <int R0, bool V2>
__device__ __forceinline__ void fp8_rows(uint8_t* stage, const int* rows, const uint2* scl, const uint8_t* kv, int w,
                                         int lane) {
  uint2 v[kFp8RowsPerBatch][3];
  // ws2: lane 8 also loads unit 72 (bytes 576..583: the 7 scale bytes + pad) of each row, so the scales arrive with
  // the data (one memory round trip per tile instead of two, no producer barrier for them)
  const int n_hi = V2 ? 9 : 8;
#pragma unroll
  for (int i = 0; i < kFp8RowsPerBatch; ++i) {
    const int row = rows[8 * w + R0 + i];
    const uint8_t* src = kv + (int64_t)(row < 0 ? 0 : row) * kFp8Row + 8 * lane;
    const uint2 z = make_uint2(0u, 0u);
    v[i][0] = row >= 0 ? ldg_u2(src) : z;
    v[i][1] = row >= 0 ? ldg_u2(src + 256) : z;
    v[i][2] = row >= 0 && lane < n_hi ? ldg_u2(src + 512) : z;
  }
#pragma unroll
  for (int i = 0; i < kFp8RowsPerBatch; ++i) {
    const int r = 8 * w + R0 + i;
    uint2 sw;  // this row's scale word (a hole: 0 -> scale 2^-127 on zero data: 0, never read anyway)
    if constexpr (V2) {
      sw.x = __shfl_sync(0xffffffffu, v[i][2].x, 8);
      sw.y = __shfl_sync(0xffffffffu, v[i][2].y, 8);
    } else {
      sw = scl[r];
    }
#pragma unroll
    for (int m = 0; m < 3; ++m) {
      const int u = lane + 32 * m;
      if (m == 2 && lane >= 8) break;
      if (u < 56) {
        const int k = u >> 3;  // scale byte k of the word
        const uint32_t sb = ((k < 4 ? sw.x : sw.y) >> (8 * (k & 3))) & 0xffu;
        const float s = sb == 255u ? __int_as_float(0x7fc00000) : __int_as_float((int)(sb << 23));
        *reinterpret_cast<uint4*>(stage + swz(r, u, kBN)) = dequant8(v[i][m], s);
      } else {
        const int e = u - 56;  // RoPE dims 448 + 4 e .. + 3: half (e & 1) of chunk 56 + e / 2
        *reinterpret_cast<uint2*>(stage + swz(r, 56 + (e >> 1), kBN) + (e & 1) * 8) = v[i][m];
      }
    }
  }
}

template <bool V2>
__device__ __forceinline__ void load_fp8_tile(uint8_t* stage, const int* rows, uint2* scl, const uint8_t* kv, int t) {
  if constexpr (!V2) {
    if (t < kBN) {
      const int row = rows[t];  // a hole gets scale bytes 127 (x 1.0) on zero data
      scl[t] = row >= 0 ? ldg_u2(kv + (int64_t)row * kFp8Row + 576) : make_uint2(0x7f7f7f7fu, 0x7f7f7f7fu);
    }
    named_bar(kBarProducer, 128);  // scale words visible
  }
  // w / lane re-read per tile (opaque to the compiler): otherwise it hoists every per-row offset out of the tile loop
  // and spills them at kProducerRegs
  uint32_t tx;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tx));
  const int w = (int)((tx >> 5) & 3), lane = (int)(tx & 31);
  fp8_rows<0, V2>(stage, rows, scl, kv, w, lane);
  if constexpr (kFp8RowsPerBatch < 8) fp8_rows<kFp8RowsPerBatch, V2>(stage, rows, scl, kv, w, lane);
}

// Ablation modes (timing only, wrong numbers; the benchmark's cuda_ws_abl_<x> rows): kFull = the kernel;
// kProducerOnly: consumers only wait full / arrive empty (the gather (+ dequant) rate); kConsumerOnly: the producer
// loads tile 0 once and then only hands out row ids and full signals, every tile's wgmma reads stage 0 (the compute
// rate); kNoXchg: no partial-S exchange through shared memory (no consumer named barrier); kQkOnly / kPvOnly: only the
// scores / only P @ V wgmma are issued; kNoSoftmax: the exchanged S packed to bf16 as P, no max / exp / row sums.
enum Mode : int {
  kFull = 0, kProducerOnly = 1, kConsumerOnly = 2, kNoXchg = 3, kQkOnly = 4, kPvOnly = 5, kNoSoftmax = 6
};

// ws (V2 false): BF16 tile j is signalled by the producer itself after it issued tile j + kLag (cp.async.wait_group).
//   Measured 117 us at b = 128: the signal of tile j comes only after the producer got the empty barrier of tile
//   j + kLag's stage, i.e. after the consumers released tile j - 2, which is exactly when they start waiting for tile
//   j: every tile pays a producer round trip (mbarrier wake-up, named barrier, 16 cp.async issues, wait_group, fence,
//   arrive) on the consumers' critical path, and the 4-stage ring acts as 2 stages.
// ws2 (V2 true): cp.async.mbarrier.arrive.noinc right after the tile's copies are issued: the full barrier completes
//   when the rows land, whatever the producer does next (the consumers fence the async proxy after their wait). FP8:
//   the scale words come with the row loads (above), the producer arrives right after its stores, as before.
template <bool FP8, bool V2, int MODE>
__device__ __forceinline__ void producer(uint8_t* smem, const uint8_t* kv, const int* idx_row, const Params& p, int lo,
                                         int n, int t, uint32_t bar_full, uint32_t bar_empty) {
  int* s_rows = reinterpret_cast<int*>(smem + Smem::rows);
  uint2* s_scl = reinterpret_cast<uint2*>(smem + Smem::scl);
  const int64_t stride_bytes = FP8 ? kFp8Row : p.stride_kv * 2;
  // thread t < 32: row id of row t of tiles j (cur) and j + 1 (nxt), loaded two tiles ahead
  int cur = -1, nxt = -1;
  if (t < kBN && n > 0) cur = load_row_id(idx_row, lo * kBN + t, p.topk, p.n_rows);
  if (t < kBN && n > 1) nxt = load_row_id(idx_row, (lo + 1) * kBN + t, p.topk, p.n_rows);
  for (int j = 0; j < n; ++j) {
    const int s = j % kStages;
    if (j >= kStages) mbar_wait(bar_empty + 8 * s, ((j / kStages) - 1) & 1);  // consumers released tile j - 4
    if (t < kBN) {
      s_rows[s * kBN + t] = cur;
      // FP8: the register loads of a tile are one synchronous round trip; pull tile j + 1's rows into L2 meanwhile
      // (ws2: only for tile 1 here; tile j + 2 is prefetched at the end of iteration j, below)
      if (FP8 && MODE != kConsumerOnly && (!V2 || j == 0) && nxt >= 0) prefetch_fp8_row(kv + (int64_t)nxt * kFp8Row);
      cur = nxt;
      nxt = j + 2 < n ? load_row_id(idx_row, (lo + j + 2) * kBN + t, p.topk, p.n_rows) : -1;
    }
    named_bar(kBarProducer, 128);  // row ids of tile j visible to the producer
    uint8_t* stage = smem + Smem::ring + s * kStageBytes;
    if constexpr (MODE == kConsumerOnly) {  // tile 0 into stage 0 once, then row ids and signals only
      if (j == 0) {
        if constexpr (FP8) {
          load_fp8_tile<true>(stage, s_rows, s_scl, kv, t);  // (the ws path spills 16 B in this loop shape)
        } else {
          issue_bf16_tile(stage, s_rows, kv, stride_bytes, t);
          cp_commit();
          cp_wait<0>();
        }
        fence_async_smem();
      }
      mbar_arrive(bar_full + 8 * s);
    } else if constexpr (!FP8 && V2) {
      issue_bf16_tile(stage, s_rows + s * kBN, kv, stride_bytes, t);
      cp_async_mbar_arrive(bar_full + 8 * s);
    } else if constexpr (!FP8) {
      issue_bf16_tile(stage, s_rows + s * kBN, kv, stride_bytes, t);
      cp_commit();
      if (j >= kLag) {  // this thread's copies of tile j - kLag have landed
        cp_wait<kLag>();
        fence_async_smem();
        mbar_arrive(bar_full + 8 * ((j - kLag) % kStages));
      }
    } else {
      load_fp8_tile<V2>(stage, s_rows + s * kBN, s_scl + s * kBN, kv, t);
      fence_async_smem();
      mbar_arrive(bar_full + 8 * s);
      // ws2: rows of tile j + 2 into L2 now (its row id has long arrived): two tiles of lead instead of one
      if (V2 && t < kBN && nxt >= 0) prefetch_fp8_row(kv + (int64_t)nxt * kFp8Row);
    }
  }
  if constexpr (!FP8 && !V2 && MODE != kConsumerOnly) {
    cp_wait<0>();
    fence_async_smem();
    for (int j = n > kLag ? n - kLag : 0; j < n; ++j) mbar_arrive(bar_full + 8 * (j % kStages));
  }
  if constexpr (!FP8 && V2) cp_wait<0>();  // no thread exits with copies in flight
}

// ------------------------------------------------------------------------------------------------ consumers

// Partial scores of warpgroup wg over its 256 dims: s [64 heads x 32 keys] (16 fp32 per thread). Not committed.
__device__ __forceinline__ void issue_scores(float* s, uint32_t q_base, uint32_t kv_base, int wg) {
#pragma unroll
  for (int ks = 0; ks < 16; ++ks) {
    const int sub = 4 * wg + (ks >> 2);
    const uint32_t koff = (ks & 3) * 32;  // 16 dims = 32 B inside the 128-byte row
    ws_wgmma_m64n32k16_ss(s, gmma_desc(q_base + sub * kQSub + koff, 16, 1024),
                          gmma_desc(kv_base + sub * kKSub + koff, 16, 1024), ks > 0 ? 1 : 0);
  }
}

// O_wg += P [64 x 32 keys] (registers) V [32 keys, dims 256 wg .. +255] (MN-major: 4 sub-tiles at LBO). Not committed.
__device__ __forceinline__ void issue_pv(float* acc, const uint32_t* pa, uint32_t kv_base, int wg) {
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    ws_wgmma_m64n256k16_rs(acc, pa + 4 * kk, gmma_desc(kv_base + 4 * wg * kKSub + kk * 16 * 128, kKSub, 1024), 1);
  }
}

// Full scores from the two partials, then the online softmax update of one tile (base 2). Thread holds s[4 j + {0,1}]
// at (r0, 8 j + 2 (lane % 4) + {0, 1}) and s[4 j + {2,3}] at row r0 + 8: a quad holds whole rows. Writes P as bf16
// A fragments (pb[i] = s[2 i], s[2 i + 1]: the m16n8k16 A layout of k-step i / 4) and the O rescale alpha.
template <bool XCHG, bool MATH>
__device__ __forceinline__ void softmax_tile(float* s, uint32_t* pb, float* alpha, float* m_run, float* l_run,
                                             const int* rows_t, float* xchg, int par, int wg, int t128, int lane,
                                             float qk_scale) {
  if constexpr (XCHG) {
    float* mine = xchg + (par * 2 + wg) * 16 * 128 + t128;
    const float* other = xchg + (par * 2 + (wg ^ 1)) * 16 * 128 + t128;
#pragma unroll
    for (int i = 0; i < 16; ++i) mine[i * 128] = s[i];
    named_bar(kBarConsumers, kConsumers);
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] += other[i * 128];  // own + other: bit-identical in both warpgroups
  }
  if constexpr (!MATH) {  // ablation kNoSoftmax
#pragma unroll
    for (int i = 0; i < 8; ++i) pb[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
    alpha[0] = alpha[1] = 1.f;
    return;
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool ok = rows_t[8 * j + 2 * (lane & 3) + e] >= 0;
      s[4 * j + e] = ok ? s[4 * j + e] * qk_scale : -INFINITY;
      s[4 * j + 2 + e] = ok ? s[4 * j + 2 + e] * qk_scale : -INFINITY;
      mx[0] = fmaxf(mx[0], s[4 * j + e]);
      mx[1] = fmaxf(mx[1], s[4 * j + 2 + e]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
    const float m_new = fmaxf(m_run[h], mx[h]);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing valid yet: any finite shift works
    alpha[h] = exp2f(m_run[h] - m_use);
    l_run[h] *= alpha[h];
    m_run[h] = m_new;
    mx[h] = m_use;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // i even: row r0, odd: row r0 + 8
    const float p0 = exp2f(s[2 * i] - mx[i & 1]), p1 = exp2f(s[2 * i + 1] - mx[i & 1]);
    l_run[i & 1] += p0 + p1;
    pb[i] = pack_bf16(p0, p1);
  }
}

// Normalise and store: out / lse (one split) or the fp32 partials (split-KV). Both warpgroups hold the same m / l.
__device__ __forceinline__ void finish(const float* acc, const float* m_run, float* l_run, const float* sink,
                                       __nv_bfloat16* out, float* lse, float* part_o, float* part_lse, const Params& p,
                                       int64_t tok, int hb, int split, int wg, int r0, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 2);
  }
  const int col0 = 256 * wg + 2 * (lane & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = hb * kH + r0 + 8 * h;
    const float m = m_run[h];
    if (p.num_splits == 1) {
      float m_f = m, sink_h = 0.f, sink2 = 0.f;
      if (p.has_sink) {
        sink_h = sink[head];
        sink2 = sink_h * 1.4426950408889634f;
        m_f = fmaxf(m, sink2);
      }
      if (m_f == -INFINITY) m_f = 0.f;
      const float a = exp2f(m - m_f);
      float l_f = l_run[h] * a;
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
    } else {
      const bool has = l_run[h] > 0.f;
      const float so = has ? 1.f / l_run[h] : 0.f;
      const int64_t prow = (tok * p.num_splits + split) * (int64_t)p.H + head;
      float* orow = part_o + prow * kD;
#pragma unroll
      for (int jn = 0; jn < 32; ++jn) {
        *reinterpret_cast<float2*>(orow + col0 + 8 * jn) =
            make_float2(acc[4 * jn + 2 * h] * so, acc[4 * jn + 2 * h + 1] * so);
      }
      if (wg == 0 && (lane & 3) == 0) part_lse[prow] = has ? m + log2f(l_run[h]) : -INFINITY;
    }
  }
}

// O (this thread's 128 accumulators: rows r0 / r0 + 8 alternate in pairs) times the softmax rescale of its two rows.
__device__ __forceinline__ void rescale_o(float* acc, const float* alpha) {
#pragma unroll
  for (int k = 0; k < 128; k += 4) {
    acc[k] *= alpha[0];
    acc[k + 1] *= alpha[0];
    acc[k + 2] *= alpha[1];
    acc[k + 3] *= alpha[1];
  }
}

// ws: O is rescaled after P_i V_i completed (the tensor cores idle meanwhile); ws2: before P_i V_i is issued, while
// S_{i+1} runs (exact either way: O_{i-1} alpha_i + P_i V_i; in ws2 O starts at 0, so the prologue's alpha is moot).
template <bool V2, int MODE>
__device__ __forceinline__ void consumer(uint8_t* smem, const __nv_bfloat16* q, const float* sink,
                                         __nv_bfloat16* out, float* lse, float* part_o, float* part_lse,
                                         const Params& p, int64_t tok, int hb, int split, int n, int tid,
                                         uint32_t bar_full, uint32_t bar_empty) {
  const int wg = tid >> 7, t128 = tid & 127, lane = tid & 31;
  const int r0 = (t128 >> 5) * 16 + (lane >> 2);
  const uint32_t q_base = smem_u32(smem + Smem::q), ring_base = smem_u32(smem + Smem::ring);
  const int* s_rows = reinterpret_cast<const int*>(smem + Smem::rows);
  float* xchg = reinterpret_cast<float*>(smem + Smem::xchg);
  {  // Q [64 heads, 512] -> swizzled smem (both warpgroups), while the producer gathers the first tiles
    const __nv_bfloat16* qt = q + tok * p.stride_qt + (int64_t)hb * kH * p.stride_qh;
    const int c = tid & 63;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int r = (tid >> 6) + 4 * i;
      cp_async16(q_base + swz(r, c, kH), qt + (int64_t)r * p.stride_qh + c * 8, true);
    }
    cp_commit();
    cp_wait<0>();
    fence_async_smem();
    named_bar(kBarConsumers, kConsumers);
  }
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float s[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) s[i] = 0.f;
  uint32_t pa[8], pb[8];  // P of the tile on the tensor cores / of the next tile
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, alpha[2] = {1.f, 1.f};
  constexpr bool kXchg = MODE != kNoXchg, kQk = MODE != kPvOnly, kPv = MODE != kQkOnly;
  constexpr bool kMath = MODE != kNoSoftmax;
  constexpr uint32_t kStageStep = MODE == kConsumerOnly ? 0 : kStageBytes;  // consumer-only: always stage 0
  if constexpr (MODE == kProducerOnly) {  // ablation: hand every tile straight back
    for (int i = 0; i < n; ++i) {
      mbar_wait(bar_full + 8 * (i % kStages), (i / kStages) & 1);
      mbar_arrive(bar_empty + 8 * (i % kStages));
    }
    n = 0;
  }
  if (n > 0) {
    mbar_wait(bar_full, 0);
    fence_async_smem();
    wg_arrive();
    if constexpr (kQk) issue_scores(s, q_base, ring_base, wg);
    wg_commit();
    wg_wait<0>();
    reg_fence<16>(s);
    // O is 0: no rescale
    softmax_tile<kXchg, kMath>(s, pa, alpha, m_run, l_run, s_rows, xchg, 0, wg, t128, lane, p.qk_scale);
  }
  // Steady state (tile i + 1 exists): S_{i+1} and P_i V_i issued back to back, softmax of i + 1 under P_i V_i.
  // The loop has no conditional wgmma so that ptxas sees one fixed group sequence (no serialisation).
  for (int i = 0; i + 1 < n; ++i) {
    const int st = i % kStages, sn = (i + 1) % kStages;
    mbar_wait(bar_full + 8 * sn, ((i + 1) / kStages) & 1);
    fence_async_smem();
    wg_arrive();
    if constexpr (kQk) issue_scores(s, q_base, ring_base + sn * kStageStep, wg);
    wg_commit();
    if constexpr (V2) {  // O *= alpha_i (softmax of tile i) while S_{i+1} is on the tensor cores, not after P_{i-1} V
      rescale_o(acc, alpha);
      reg_fence<128>(acc);  // the multiplies stay before the fence (asm volatile keeps its order; they feed it)
      wg_arrive();  // O was written by ordinary instructions: fence before the wgmma that accumulates into it
    }
    if constexpr (kPv) issue_pv(acc, pa, ring_base + st * kStageStep, wg);
    wg_commit();
    wg_wait<1>();
    reg_fence<16>(s);
    softmax_tile<kXchg, kMath>(s, pb, alpha, m_run, l_run, s_rows + sn * kBN, xchg, (i + 1) & 1, wg, t128, lane,
                               p.qk_scale);
    wg_wait<0>();
    reg_fence<128>(acc);
    reg_fence<8>(pa);  // pa stays allocated until P_i V_i has read it
    mbar_arrive(bar_empty + 8 * st);
    if constexpr (!V2) rescale_o(acc, alpha);
#pragma unroll
    for (int k = 0; k < 8; ++k) pa[k] = pb[k];
  }
  if (n > 0) {  // last tile: P V only
    const int st = (n - 1) % kStages;
    if constexpr (V2) {
      rescale_o(acc, alpha);
      reg_fence<128>(acc);
    }
    wg_arrive();
    if constexpr (kPv) issue_pv(acc, pa, ring_base + st * kStageStep, wg);
    wg_commit();
    wg_wait<0>();
    reg_fence<128>(acc);
    reg_fence<8>(pa);
    mbar_arrive(bar_empty + 8 * st);
  }
  finish(acc, m_run, l_run, sink, out, lse, part_o, part_lse, p, tok, hb, split, wg, r0, lane);
}

// ------------------------------------------------------------------------------------------------ kernel

template <bool FP8, bool V2, int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    ws_decode_kernel(const __nv_bfloat16* __restrict__ q, const uint8_t* __restrict__ kv, const int* __restrict__ idx,
                     const float* __restrict__ sink, __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                     float* __restrict__ part_o, float* __restrict__ part_lse, Params p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Dynamic shared memory is only 16-byte aligned by contract: align to 1 KiB (the swizzle atom) by hand.
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t bar_full = smem_u32(smem + Smem::bars), bar_empty = bar_full + 8 * kStages;
  const int tid = threadIdx.x;
  const int num_hb = p.H / kH;
  const int hb = blockIdx.x % num_hb;
  const int split = (blockIdx.x / num_hb) % p.num_splits;
  const int64_t tok = blockIdx.x / (num_hb * p.num_splits);
  const int n_tiles = (p.topk + kBN - 1) / kBN;
  const int lo = split * p.tiles_per_split;
  const int n = max(min(lo + p.tiles_per_split, n_tiles) - lo, 0);
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full + 8 * s, 128);
      mbar_init(bar_empty + 8 * s, kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid >= kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    producer<FP8, V2, MODE>(smem, kv, idx + tok * p.stride_it, p, lo, n, tid - kConsumers, bar_full, bar_empty);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    consumer<V2, MODE>(smem, q, sink, out, lse, part_o, part_lse, p, tok, hb, split, n, tid, bar_full, bar_empty);
  }
}

template <bool FP8, bool V2, int MODE>
static int launch_impl(const LaunchArgs& a, cudaStream_t stream) {
  const int smem = Smem::total + 1024;  // + alignment slack
  auto kern = ws_decode_kernel<FP8, V2, MODE>;
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

}  // namespace fm_ws

namespace fm_ws {
template <bool FP8, bool V2>
static int launch_mode(const LaunchArgs& a, int mode, cudaStream_t s) {
  switch (mode) {
    case kFull: return launch_impl<FP8, V2, kFull>(a, s);
    case kProducerOnly: return launch_impl<FP8, V2, kProducerOnly>(a, s);
    case kConsumerOnly: return launch_impl<FP8, V2, kConsumerOnly>(a, s);
    case kNoXchg: return launch_impl<FP8, V2, kNoXchg>(a, s);
    case kQkOnly: return launch_impl<FP8, V2, kQkOnly>(a, s);
    case kPvOnly: return launch_impl<FP8, V2, kPvOnly>(a, s);
    case kNoSoftmax: return launch_impl<FP8, V2, kNoSoftmax>(a, s);
    default: return (int)cudaErrorInvalidValue;
  }
}
}  // namespace fm_ws

int fm_ws_launch(const fm_ws::LaunchArgs& a, bool fp8, int variant, int mode, uintptr_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (variant == 2) {
    return fp8 ? fm_ws::launch_mode<true, true>(a, mode, s) : fm_ws::launch_mode<false, true>(a, mode, s);
  }
  if (variant == 1) {
    return fp8 ? fm_ws::launch_mode<true, false>(a, mode, s) : fm_ws::launch_mode<false, false>(a, mode, s);
  }
  return (int)cudaErrorInvalidValue;
}

const char* fm_ws_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

int fm_ws_smem_bytes(bool fp8) {
  (void)fp8;  // same layout for both caches: FP8 rows are dequantised by the producer straight into the ring
  return fm_ws::Smem::total + 1024;
}

int fm_ws_block_rows() { return fm_ws::kBN; }
