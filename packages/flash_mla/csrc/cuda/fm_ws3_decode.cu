// ws3: warp-specialised sparse MLA decode/prefill kernel for sm_90a with 64-row tiles, V4 shape: 64 heads x 512 dims
// per query token. Same math, split-KV format and hole rules as fm_ws_decode.cu (ws / ws2) and fm_sparse_decode.cu
// (the serial kernel); Python side backends/cuda/cuda_ws_decode.py (variant "ws3").
//
// Why (session-4 ablations of ws2 at b = 128, s_q = 2): ws2's compute loop alone (consumer-only 84 us) was slower than
// the whole serial kernel (92 us): 32-row tiles pay the fixed per-tile costs (partial-S exchange, barriers, softmax
// reductions) 20 times per token. And the FP8 producer (one warpgroup dequantising) alone needed 109 us.
//
// One CTA = one query token's 64 heads x one split of its index list; 384 threads: warpgroups 0, 1 = consumers,
// 2 = producer.
//   Consumers (the serial kernel's split): per 64-row tile, warpgroup w scores keys 32 w .. 32 w + 31 over all 512
//     dims (32 x wgmma m64n32k16, nothing duplicated, no partial-S exchange), the two warpgroups exchange only the
//     per-row max (one named barrier) and P (bf16 [64 heads x 64 keys] through shared memory, double-buffered by
//     tile parity, one named barrier), then w accumulates O[:, 256 w .. +255] += P V (4 x wgmma m64n256k16, P from
//     shared memory). Row sums are per warpgroup (its 32 keys) and added once at the end. Two barriers per 64 rows
//     instead of ws2's one per 32 rows plus the 8 KiB partial-S round trip, and half as many softmax passes.
//   Order per tile: S_i, softmax_i, P_i V_i, release of stage i (consumer() says why not S_{i+1} under P_i V_i). The
//     overlap is across roles: the producer gathers (and dequantises) tile i + 1 while the consumers compute tile i.
//   Producer: keeps a 2-stage ring of [64 keys, 512] bf16 tiles (128-byte swizzle, 64 KiB each) full. Shared memory:
//     Q 64 KiB + ring 128 KiB + P 16 KiB + row ids / maxima / barriers = 209 KiB; a third 64 KiB stage does not fit
//     next to Q (256 KiB > 227 KiB). So the ring is one tile ahead, and the producer reaches further through L2:
//     BF16: 16-byte cp.async straight into the ring, full barrier by cp.async.mbarrier.arrive (ws2), then the rows
//       of the NEXT tile are prefetched into L2 (prefetch.global.L2) while that tile's stage is still busy: its
//       cp.async later reads L2, not HBM.
//     FP8: warp W (0..3) owns rows 16 W .. 16 W + 15 of a tile, in 2 batches of 8 rows: 8-byte global loads into
//       registers (the scale word with them, as ws2), e4m3 * 2^(s - 127) -> bf16 (exact) stored into the ring. The
//       first batch's loads are issued BEFORE waiting for the stage to be released (registers need no free stage),
//       and the next tile's rows are prefetched into L2 after each tile.
//   More dequant threads for FP8 do not fit: a second producer warpgroup (512 threads) caps the launch at 128
//     registers per thread and ptxas refuses the m64n256k16 P @ V there (C7602: needs >= 154, whatever setmaxnreg
//     gives the consumers later); consumers helping with the dequant of tile i + 2 would need a free stage while
//     their wgmma run, and with two stages there is none (tile i in use, tile i + 1 landing), or a raw FP8 staging
//     buffer, which fits only for half a tile (P single-buffered). So ws3's FP8 producer is one warpgroup, as ws2's
//     (8 rows x 3 loads per thread in flight), with the first batch of a tile loaded before the stage wait and the
//     next tile's rows prefetched into L2.
//   Registers (setmaxnreg: .inc only takes what .dec gave back, so the totals must equal the launch allocation):
//     384 x 168 = 128 x 88 (producer: the FP8 batch of 48 registers in flight across the stage wait spills at 72)
//     + 256 x 208 (consumers: O [64, 256] fp32 = 128, S 16, softmax state).
// Split-KV: split s of a token owns 64-row tiles [s * tiles_per_split, ...); num_splits == 1 writes out (bf16) and
// lse (natural log, sink included), else the fp32 partials acc / l and base-2 lse of triton_split_attn's
// _combine_kernel. Holes (any index outside [0, n_rows)): never read (zero row), score -inf.
// Timing-only ablation modes (enum Mode, wrong numbers): producer only, consumers only (as fm_ws_decode.cu's 1 and 2).
// Extra cache (template flag EXTRA, fm_ws3_launch_extra; session 5 round 4, GPU-run in s6): the engine's call, the
//   main list (topk into kv) followed by the extra list (topk2 into kv2, same row format), cut into 64-entry tiles as
//   the serial kernel does (a tile may straddle the two lists). Row ids live in one space: [0, n_rows) = kv,
//   [n_rows, n_rows + n_rows2) = kv2 (the host checks it fits in int32), so the ring's row tables, the hole rule
//   (id < 0) and the consumers are unchanged; only the producer's address computation (Src) picks the cache. A tile
//   whose 64 ids are all holes is skipped whole by the consumers (exact, as in the serial kernel: the engine's fresh
//   prompts have two such tiles): the producer publishes a per-stage "any valid" flag (one ballot per row warp) next to
//   the row ids, and the consumers hand the stage straight back. EXTRA = false compiles to the single-cache kernel.
// Persistent variant ws3p (session 5 round 5, GPU-run in s6): ws3p_decode_kernel near the end of the file, the same
//   per-tile code in a grid of min(#SMs, work items) CTAs looping over (token, split, head block) items.
// ws3p option builds (session 6, GPU-run there; ws3p_decode_kernel's OPT bits, kOpt* below; fm_ws3p_launch_opt):
//   a wide FP8 producer batch, a lazy O rescale and early scores of the next tile, each bit-identical to ws3p; one
//   scoring warpgroup (same math, other summation order).
// Compile check: tests/test_mla_ws.py::test_ws3_source_compiles_for_sm90a_without_spills (21 instances: + 2 EXTRA,
// + 2 ws3p, + 11 ws3p option builds).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "fm_ws3_decode.h"
#include "fm_ws3_wgmma.cuh"
#include "fm_ws_wgmma.cuh"
#include "fm_fp8v.cuh"

namespace fm_ws3 {

// FP8 helpers shared with the serial kernel (fm_fp8v.cuh)
using fm_fp8v::bf16x2_scale;
using fm_fp8v::dequant8v;
using fm_fp8v::ldg_unit_if;
using fm_fp8v::sts128;

using fm_ws::LaunchArgs;
using fm_ws::Params;

constexpr int kH = 64;                  // heads per CTA (the wgmma M)
constexpr int kD = 512;                 // head dim
constexpr int kBN = 64;                 // KV rows per tile
constexpr int kStages = 2;              // ring depth (a third 64 KiB stage does not fit next to Q)
constexpr int kConsumers = 256;         // warpgroups 0, 1
constexpr int kSub = 64 * 128;          // [64 rows, 64 bf16] swizzled sub-tile: 8 KiB (Q, KV stage, P)
constexpr int kStageBytes = 8 * kSub;   // [64, 512] bf16: 64 KiB
constexpr int kFp8Row = 584;
constexpr int kFp8Batch = 8;            // FP8 rows per producer warp whose loads are in flight together (2 batches)
constexpr int kBarConsumers = 1, kBarProducer = 2;  // named barriers (0 is __syncthreads)
constexpr int kBarWg0 = 3;  // + wg: one consumer warpgroup's 128 threads (ws3p option kOptEarlyS: wg_all)
// ws3p options (session 6; template OPT of ws3p_decode_kernel, bit flags; 0 = ws3p as measured in session 6 run 1):
//   kOptWideFp8: the FP8 producer loads all 16 rows of a warp before storing any (one load round trip per tile, not
//     two), paid for with the 120 / 192 register split (Cfg WIDE). Same bits as 0.
//   kOptLazy: O *= alpha skipped by a warp whose 16 rows all kept their running max (alpha == 1 exactly: x * 1 == x
//     for every finite x and the final scaling re-canonicalises NaN): 128 FMULs off the critical path. Same bits.
//   kOptEarlyS: after issuing P_i V_i, if tile i + 1 (same item) has ALREADY landed (non-blocking test, voted per
//     warpgroup), its scores are issued at once behind P_i V_i (tensor pipe kept busy across the tile boundary);
//     stage i is still released as soon as P_i V_i completes (wgmma.wait_group 1). When tile i + 1 has not landed,
//     the session-6 order (release, then wait) is kept, so the producer never waits longer for a stage. Same bits.
//   kOptOneScorer (alone or with kOptLazy; NOT bit-identical: same math, other summation order): consumer warpgroup 0 scores all 64
//     keys of a tile (32 x m64n64k16: 128 KiB of shared-memory operand reads per tile instead of 2 x 96 KiB for two
//     warpgroups' m64n32k16, whose A = Q re-read is the larger part) and runs the whole online softmax (no row-max
//     exchange: one named barrier per tile instead of two); it publishes P, alpha and the running max, and warpgroup
//     1 only rescales its O half and runs its P @ V. Row sums over all 64 keys in warpgroup 0 (warpgroup 1's stay 0),
//     so lse / out differ from ws3p in the last bits.
//   kOptVec (session 9; built in fm_ws3v_decode.cu only, as opt 24 = ws3p1 + kOptVec: "ws3p1v"): fp8v_tile instead
//     of fp8_tile. Lane-uniform FP8 producer: lane u (0..27) dequantises the row's 16-byte e4m3 unit u (16 values,
//     ONE scale byte u / 4, loaded by the lane itself: no shuffles), lanes 28..31 repeat lane 27's unit (same loads,
//     same stores: no branch); the 128 RoPE bytes of the warp's 16 rows are copied by a separate pass (16 bytes per
//     lane and row). Conversion per e4m3 pair: cvt to f16x2, f16 -> f32 (exact), pack to bf16x2 (exact: e4m3 values
//     are bf16 numbers), one bf16x2 multiply by bf16x2_scale(sb) (session 7's dequant8c multiply: same bits as
//     dequant8, GPU-tested over every code in s7). Rows in 4 batches of 4, 8 rows (40 registers) in flight: the
//     first 8 and the RoPE loads before the stage wait, then each stored row's registers reloaded with the row 8
//     further; one predicated asm block loads a row (one setp, immediate offsets); the row loop is not unrolled (code
//     size: the session-9 profile's no_inst stalls). Lanes alternate which of their two chunks they store first,
//     so every STS.128 wavefront is bank-conflict free. SASS per tile and producer warp (nvcc 13.0): ~1,069 executed
//     instructions, 671 static (fp8_tile: ~1,776 both). Same bits as without it. (The session-7 kOptCvt /
//     kOptCvtHalf builds, ws3p1c / ws3p1h, 0.89-0.97x, were removed in session 9.)
//   kOptOverlap + kOptOvlAdapt (session 10; with kOptOneScorer only, always together: opt 106 = ws3p1l + both on
//     BF16 "ws3p1oa", 120 = ws3p1v + both on FP8 "ws3p1voa"; fm_ws3p_launch_ovl): FA3-style intra-warpgroup overlap
//     in the scoring warpgroup 0 (consumer_p1o): per tile i, if tile i + 1 of the same item has ALREADY landed
//     (non-blocking test voted over the warpgroup) it ISSUES S_{i+1} (committed, not waited for) before running
//     softmax_i on S_i already in registers, else behind P_i V_i if landed by then, else in ws3p1's order; it never
//     waits for tile i + 1 early. Why: with two stages, tile i + 1's gather only starts when stage i - 1 is released
//     (end of tile i - 1), so a blocking wait before softmax_i serialises the gather with tile i's compute whenever
//     the producer is not much faster than the consumers. The tensor pipe thus has S_{i+1} queued while warpgroup 0
//     runs the softmax. Only within an item (the next item has another Q). Warpgroup 0 holds two score sets
//     (2 x 32) next to its O half: per-warpgroup setmaxnreg 88 (producer) / 240 (warpgroup 0) / 176 (warpgroup 1:
//     O half + fragments; 232 / 184 left 8 spilled bytes in the FP8 build's producer). Same math and order as
//     ws3p1: bit-identical to ws3p1l (BF16) / ws3p1v (FP8). H200 (session 10, benchmarks/results/
//     2026-12-01-s10-bench-fm_overlap.json) x its base: 0.994-0.999 at 64 tokens, 1.006-1.022 from 128 tokens and
//     at prefill: the API default from 128 tokens. (Session 10 also measured and removed the blocking form, S_{i+1}
//     always before softmax_i, "ws3p1o" / "ws3p1vo", 0.90-0.97x, and the P exchange on an mbarrier instead of the
//     named barrier, kOptPBar "ws3p1oam" / "ws3p1voam", never above the adaptive form. A third form, S_{i+1} always
//     issued behind P_i V_i with a blocking wait, spilled in every arrangement tried: never built.)
//   kOptVecWide (session 11; FP8 overlap build 632 = 120 + 512): fp8v_tile<3>, the lane-uniform producer with 12 of a
//     warp's 16 rows loaded before the stage wait (60 registers) instead of 8 (rows loaded after the release expose
//     their latency once per tile); setmaxnreg 104 / 240 / 160 (16 rows spilled at 104 / 112). Same bits as 120.
//   kOptThresh (session 14; with kOptLazy, on the overlap builds: BF16 1130 = 106 + 1024, FP8 1658 = 632 + 2 + 1024,
//     "ws3p1oat", the default since): softmax_tile64 moves a row's running max only when the tile's max passes it by
//     more than kThreshLog2, so alpha is exactly 1 on most tiles and lazy_rescale skips both warpgroups' O *= alpha;
//     P = exp2(s * scale - m) by one FFMA (the row max is taken on the raw scores: max commutes with a positive
//     scale). P <= 2^8 between moves, l and O in fp32. Same math, other rounding: not bit-equal to 106 / 632.
constexpr int kOptWideFp8 = 1, kOptLazy = 2, kOptEarlyS = 4, kOptOneScorer = 8, kOptVec = 16, kOptOverlap = 32,
              kOptOvlAdapt = 64, kOptVecWide = 512, kOptThresh = 1024;
constexpr float kThreshLog2 = 8.f;  // kOptThresh: the running max moves when a tile's max passes it by more than 2^8

enum Mode : int { kFull = 0, kProducerOnly = 1, kConsumerOnly = 2 };

// Kernel-side view of fm_ws3::Extra (the second cache); unused (zeros) when EXTRA is false.
struct XParams {
  const uint8_t* kv2;  // rows of the second cache (BF16: 1 KiB rows at stride_kv2 bytes; FP8: contiguous 584-byte rows)
  const int* idx2;     // int32 [tokens, topk2] at stride_it2 elements
  int topk2;
  int64_t n_rows2, stride_it2, stride_kv2;
};

// Thread / register split (both cache formats). One producer warpgroup: a second one (512 threads) caps the launch
// at 128 registers per thread, and ptxas refuses the m64n256k16 P @ V at that cap (C7602: needs >= 154 even when
// setmaxnreg would give the consumers more), so 384 threads is the largest CTA with O [64, 256] in registers.
// WIDE (ws3p options, kOptWideFp8): the FP8 producer holds all 16 rows of a warp in registers (one load round trip
// per tile instead of two): 120 producer / 192 consumer registers.
template <bool FP8, bool WIDE = false>
struct Cfg {
  static constexpr int kProducers = 128;
  static constexpr int kThreads = kConsumers + kProducers;
  static constexpr int kLaunchRegs = 168;  // what __launch_bounds__(384, 1) gives each thread
  static constexpr int kProducerRegs = WIDE ? 120 : 88;
  static constexpr int kConsumerRegs = WIDE ? 192 : 208;
  static_assert(kLaunchRegs * kThreads <= 65536, "register file");
  static_assert(kProducers * kProducerRegs + kConsumers * kConsumerRegs == kLaunchRegs * kThreads,
                "setmaxnreg budget must add up to the launch allocation (else .inc waits forever / wastes)");
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 && kConsumerRegs <= 256, "setmaxnreg range");
  static_assert(kBN == (kProducers / 32) * 2 * kFp8Batch, "FP8: 4 producer warps x 2 batches x 8 rows");
};

struct Smem {
  static constexpr int q = 0;
  static constexpr int ring = 8 * kSub;
  static constexpr int p = ring + kStages * kStageBytes;  // bf16 P [2 parity][64 heads, 64 keys], swizzled
  static constexpr int rows = p + 2 * kSub;               // int [kStages][64] row ids for the consumers (-1: hole)
  static constexpr int prow = rows + kStages * kBN * 4;   // int [2][64] row ids for the producers
  static constexpr int red = prow + 2 * kBN * 4;          // float [2 parity][2 wg][64] row maxima
  static constexpr int lsum = red + 2 * 2 * 64 * 4;       // float [2 wg][64] row sums (end)
  static constexpr int bars = lsum + 2 * 64 * 4;          // uint64 full[kStages], empty[kStages]
  static constexpr int total = bars + 2 * kStages * 8;
  // EXTRA only (past the single-cache layout, which stays as it was): int [kStages][2] "the tile has a valid row",
  // one word per producer row warp (rows 0..31, 32..63)
  static constexpr int any = total;
  static constexpr int total_extra = any + kStages * 2 * 4;
};
static_assert(Smem::total_extra + 1024 <= 232448, "shared memory over the sm_90 opt-in limit");

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

// gmma_desc(addr + off, lbo, sbo) from d = gmma_desc(addr, lbo, sbo): shared addresses stay below 256 KiB, so the
// start-address field (addr >> 4, bits 0..13) never carries and the descriptor moves by off >> 4. Why (session 14
// profile of the prefill default): computing every wgmma's two descriptors from scratch cost ~10 uniform-datapath
// instructions per wgmma, ~35 % of the scoring warpgroup's ~1,210 instructions per tile; one add each instead.
__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t off) {
  return (d & 0xffffffff00000000ull) | (uint32_t)((uint32_t)d + (off >> 4));  // 32-bit add: no carry chain
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
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

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The arrival fires when every earlier cp.async of this thread has landed (.noinc: counts against the init count).
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
// Non-blocking: whether the phase with this parity has completed (acquire, as mbar_wait).
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// AND of v over the 128 threads of one warpgroup (named barrier id, 128 threads, with a reduction): a decision every
// thread of the warpgroup takes alike, as the .sync.aligned wgmma instructions that follow it require.
// (The id is an immediate: a register id makes ptxas reserve all 16 named barriers.)
template <int ID>
__device__ __forceinline__ bool wg_all(bool v) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.and.pred q, %2, 128, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"((uint32_t)v), "n"(ID)
      : "memory");
  return r != 0;
}
__device__ __forceinline__ void named_bar(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

__device__ __forceinline__ int load_row_id(const int* idx_row, int pos, int topk, int64_t n_rows) {
  if (pos >= topk) return -1;
  const int v = __ldg(idx_row + pos);
  return (v >= 0 && (int64_t)v < n_rows) ? v : -1;
}

// Row id of entry pos of the token's index space (EXTRA: the main list, then the extra list mapped past n_rows; see the
// top of the file), -1 for a hole.
template <bool EXTRA>
__device__ __forceinline__ int row_id(const int* idx_row, const int* idx2_row, int pos, const Params& p,
                                      const XParams& x) {
  if constexpr (EXTRA) {
    if (pos >= p.topk) {
      pos -= p.topk;
      if (pos >= x.topk2) return -1;
      const int v = __ldg(idx2_row + pos);
      return (v >= 0 && (int64_t)v < x.n_rows2) ? (int)(p.n_rows + v) : -1;
    }
  }
  return load_row_id(idx_row, pos, p.topk, p.n_rows);
}

// Where a row id (>= 0) lives: kv (stride bytes per row), or with EXTRA the ids from n1 on in kv2 (stride2).
template <bool EXTRA>
struct Src {
  const uint8_t* kv;
  int64_t stride;
  const uint8_t* kv2;
  int64_t stride2, n1;
  __device__ __forceinline__ const uint8_t* at(int row) const {
    if constexpr (EXTRA) {
      const bool e = row >= n1;
      return (e ? kv2 : kv) + (e ? (int64_t)row - n1 : (int64_t)row) * (e ? stride2 : stride);
    }
    return kv + (int64_t)row * stride;
  }
};

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


// ------------------------------------------------------------------------------------------------ producers

// BF16 rows (holes zero-filled, never read): producer warp W, lane group g = lane / 8, e = lane % 8 copies 16-byte
// chunks 8 k + e (k = 0..7) of rows 4 W + g + 16 i (i = 0..3): each warp instruction moves 4 rows x 128 bytes (4
// consecutive 128-byte rows of one sub-tile), and a thread looks up 4 row ids per tile, not 32. Session 14's gather
// microbenchmark (benchmarks/micro/fm_gather_ceiling.cu, H200, no consumers): 10.5 TB/s from L2 and 4.57 from HBM,
// against 7.3 / 3.3 for the mapping before (chunk t % 64 of rows t / 64 + 2 i: one row's 512 bytes per instruction).
template <bool EXTRA>
__device__ __forceinline__ void issue_bf16_tile(uint8_t* stage, const int* rows, const Src<EXTRA>& src, int t) {
  const uint32_t base = smem_u32(stage);
  const int e = t & 7, r0 = 4 * (t >> 5) + ((t >> 3) & 3);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = r0 + 16 * i;
    const int row = rows[r];
    const uint8_t* g = src.at(row < 0 ? 0 : row) + e * 16;
    const uint32_t d = base + swz(r, e, kBN);  // chunk 8 k + e: + k sub-tiles (the swizzle phase is r % 8 for all k)
#pragma unroll
    for (int k = 0; k < 8; ++k) cp_async16(d + k * kBN * 128, g + 128 * k, row >= 0);
  }
}

// FP8: kFp8Batch rows r0 .. of one warp into registers. Lane l reads the row's 8-byte units l, l + 32 and (l < 9)
// l + 64 (unit u: bytes 8u .. 8u + 7; e4m3 for u < 56, RoPE bf16 for 56..71, the 7 scale bytes + pad at 72): each
// load instruction of the warp is 256 contiguous bytes.
template <bool EXTRA, int B = kFp8Batch>
__device__ __forceinline__ void fp8_load(uint2 (&v)[B][3], const int* rows, const Src<EXTRA>& kv, int r0, int lane) {
#pragma unroll
  for (int i = 0; i < B; ++i) {
    const int row = rows[r0 + i];
    // (EXTRA = false: the single-cache expression as it was, so that kernel compiles unchanged)
    const uint8_t* src = EXTRA ? kv.at(row < 0 ? 0 : row) + 8 * lane
                               : kv.kv + (int64_t)(row < 0 ? 0 : row) * kFp8Row + 8 * lane;
    const uint2 z = make_uint2(0u, 0u);
    v[i][0] = row >= 0 ? ldg_u2(src) : z;
    v[i][1] = row >= 0 ? ldg_u2(src + 256) : z;
    v[i][2] = row >= 0 && lane < 9 ? ldg_u2(src + 512) : z;
  }
}

// The batch loaded by fp8_load, dequantised into the bf16 stage (a hole: zero data, scale word 0 -> 0).
template <int B = kFp8Batch>
__device__ __forceinline__ void fp8_store(uint8_t* stage, const uint2 (&v)[B][3], int r0, int lane) {
#pragma unroll
  for (int i = 0; i < B; ++i) {
    const int r = r0 + i;
    uint2 sw;  // the row's scale word, held by lane 8
    sw.x = __shfl_sync(0xffffffffu, v[i][2].x, 8);
    sw.y = __shfl_sync(0xffffffffu, v[i][2].y, 8);
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

// One FP8 tile by the 4 producer warps (warp W: rows 16 W .. 16 W + 15). The first batch is loaded before waiting for
// the stage (wait: j >= kStages), then t < 64 publish the consumers' row ids of the stage.
template <bool EXTRA, bool WIDE = false>
__device__ __forceinline__ void fp8_tile(uint8_t* stage, const int* rows, const Src<EXTRA>& kv, bool wait, uint32_t bar,
                                         uint32_t parity, int* s_rows_st, int cur, int t) {
  // warp / lane re-read per tile (opaque to the compiler): otherwise it hoists every per-row offset out of the tile
  // loop and spills them (as in fm_ws_decode.cu)
  uint32_t tx;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tx));
  const int r0 = 2 * kFp8Batch * (int)((tx - kConsumers) >> 5), lane = (int)(tx & 31);
  if constexpr (WIDE) {  // all 2 * kFp8Batch rows of the warp in flight at once (96 registers), then one store pass
    uint2 w[2 * kFp8Batch][3];
    fp8_load<EXTRA, 2 * kFp8Batch>(w, rows, kv, r0, lane);
    if (wait) mbar_wait(bar, parity);
    if (t < kBN) s_rows_st[t] = cur;
    fp8_store<2 * kFp8Batch>(stage, w, r0, lane);
    return;
  }
  uint2 v[kFp8Batch][3];
  fp8_load(v, rows, kv, r0, lane);
  if (wait) mbar_wait(bar, parity);
  if (t < kBN) s_rows_st[t] = cur;
  fp8_store(stage, v, r0, lane);
  fp8_load(v, rows, kv, r0 + kFp8Batch, lane);
  fp8_store(stage, v, r0 + kFp8Batch, lane);
}

// ------------------------------------------------------------------ kOptVec: the lane-uniform FP8 producer (fp8v_tile)
// Per-lane bases of fp8v_tile's loads (row * 584 is added per row): first / second 8 bytes of the unit, scale byte.
struct Fp8vBase {
  const uint8_t *k1, *k2, *ks;
};
// (ldg_unit_if, sts128, dequant8v: fm_fp8v.cuh)

// 4 rows of one lane's 16-byte e4m3 unit: 2 x 8 bytes (rows are only 8-byte aligned: 584 = 8 x 73) and its scale byte.
struct Fp8vRows {
  uint2 lo[4], hi[4];
  uint32_t sb[4];
};
__device__ __forceinline__ void fp8v_load_row(Fp8vRows& v, int i, int row, const Fp8vBase& kb) {
  const int64_t o = (int64_t)row * kFp8Row;
  ldg_unit_if(kb.k1 + o, kb.k2 + o, kb.ks + o, row, v.lo[i], v.hi[i], v.sb[i]);
}
// Rows rows[0..3] (shared memory, 16-byte aligned) of the cache into v.
__device__ __forceinline__ void fp8v_load4(Fp8vRows& v, const int* rows, const Fp8vBase& kb) {
  const int4 r4 = *reinterpret_cast<const int4*>(rows);
  const int rr[4] = {r4.x, r4.y, r4.z, r4.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) fp8v_load_row(v, i, rr[i], kb);
}
// Stores 4 rows I0 .. I0 + 3 (mod 8: the swizzle phase; rows 8 k + I0 + i of the warp) of the unit as its chunks
// 2u + h and 2u + 1 - h (8 bf16 each, v.lo then v.hi; h = (u / 4) % 2): base = stage + sub-tile (u / 4) + row 0 of the
// warp (+ 8 k rows), l5 = ((2u + h) % 8) << 4. Why h: the 8 lanes of a quarter warp (one STS.128 wavefront) then
// write 4 even and 4 odd chunk positions of their rows (8 different bank groups: no conflict); with chunk 2u first
// for all, lanes u and u + 4 would share a bank group (2 wavefronts).
// reload: each row's registers are refilled with row nrows[i] (8 rows further) as soon as that row is stored, so the
// next batch's loads go out one row at a time, not after the whole batch.
template <int I0>
__device__ __forceinline__ void fp8v_store4(uint32_t base, Fp8vRows& v, uint32_t l5, bool reload, const int* nrows,
                                            const Fp8vBase& kb) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t a = base + (uint32_t)(I0 + i) * 128u + (l5 ^ (uint32_t)(((I0 + i) & 7) << 4));
    const uint32_t m2 = bf16x2_scale(v.sb[i]);
    sts128(a, dequant8v(v.lo[i], m2));
    sts128(a ^ 16u, dequant8v(v.hi[i], m2));  // the other chunk: bit 4 of a comes from the swizzle term only
    if (reload) fp8v_load_row(v, i, nrows[i], kb);
  }
}

// kOptVec's FP8 tile (fp8_tile's contract, single cache): warp W's rows 16 W .. 16 W + 15 in 4 batches of 4 rows (8
// rows in flight: rows 8.. reload a row's registers as soon as it is stored), plus one RoPE pass (lane l: 16-byte
// RoPE chunk l % 8 of rows l / 8 + 4 j, j = 0..3). The first two batches and the RoPE loads are issued before the
// stage wait. kSets 3 (kOptVecWide, session 11): the first THREE batches (12 rows) before the wait; the last 4 rows
// reuse the first set's registers, reloaded row by row as rows 0..3 are stored.
template <int kSets = 2>
__device__ __forceinline__ void fp8v_tile(uint8_t* stage, const int* rows, const uint8_t* kv, bool wait, uint32_t bar,
                                          uint32_t parity, int* s_rows_st, int cur, int t) {
  static_assert(kSets == 2 || kSets == 3, "rows in flight before the stage wait: 8 or 12");
  uint32_t tx;  // re-read per tile (opaque): keeps the per-lane offsets from being hoisted and spilled (fp8_tile)
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tx));
  const int r0 = 16 * (int)((tx - kConsumers) >> 5), lane = (int)(tx & 31);
  const int u = min(lane, 27);  // lanes 28..31 repeat lane 27's unit (identical data to identical addresses)
  const int h = (u >> 2) & 1;  // this lane's first chunk: 2u + h (fp8v_store4)
  // per-lane bases, opaque: else the compiler splits them into (row * 584 + lane offset) + kv, 3 instructions a load
  Fp8vBase kb;
  const uint8_t* kvr;
  asm("mov.b64 %0, %1;\n" : "=l"(kb.k1) : "l"(kv + 16 * u + 8 * h));
  asm("mov.b64 %0, %1;\n" : "=l"(kb.k2) : "l"(kv + 16 * u + 8 - 8 * h));
  asm("mov.b64 %0, %1;\n" : "=l"(kb.ks) : "l"(kv + 576 + (u >> 2)));
  const int* wrows = rows + r0;
  Fp8vRows a, b, c;  // (c: kSets 3 only)
  fp8v_load4(a, wrows, kb);
  fp8v_load4(b, wrows + 4, kb);
  if constexpr (kSets == 3) fp8v_load4(c, wrows + 8, kb);
  uint2 rp[4][2];  // RoPE: rows r0 + (lane >> 3) + 4 j, bytes 448 + 16 (lane & 7) ..
  const int e = lane & 7, rl = lane >> 3;
  asm("mov.b64 %0, %1;\n" : "=l"(kvr) : "l"(kv + 448 + 16 * e));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int row = wrows[rl + 4 * j];
    uint32_t unused;
    const uint8_t* p = kvr + (int64_t)row * kFp8Row;
    ldg_unit_if(p, p + 8, p, row, rp[j][0], rp[j][1], unused);  // (the byte load of p itself: one more, harmless)
  }
  if (wait) mbar_wait(bar, parity);
  if (t < kBN) s_rows_st[t] = cur;
  const uint32_t st = smem_u32(stage);
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // RoPE chunk 56 + e of row r0 + rl + 4 j: sub-tile 7, phase (rl + 4 j) % 8
    const uint32_t addr =
        st + 7u * kSub + (uint32_t)(r0 + rl + 4 * j) * 128u + (uint32_t)((e ^ ((rl + 4 * j) & 7)) << 4);
    sts128(addr, make_uint4(rp[j][0].x, rp[j][0].y, rp[j][1].x, rp[j][1].y));
  }
  const uint32_t base = st + (uint32_t)(u >> 2) * kSub + (uint32_t)r0 * 128u;
  const uint32_t l5 = ((uint32_t)(u & 3) << 5) | ((uint32_t)h << 4);
  if constexpr (kSets == 3) {
    fp8v_store4<0>(base, a, l5, true, wrows + 12, kb);  // rows 0..3, each reloaded at once with row 12 + i
    fp8v_store4<4>(base, b, l5, false, wrows, kb);
    fp8v_store4<0>(base + 1024u, c, l5, false, wrows, kb);
    fp8v_store4<4>(base + 1024u, a, l5, false, wrows, kb);
  } else {
#pragma unroll 1
    for (int k = 0; k < 2; ++k) {  // rows 8 k .. 8 k + 7 of the warp: a = the first 4, b = the next 4
      const uint32_t bk = base + (uint32_t)k * 1024u;
      fp8v_store4<0>(bk, a, l5, k == 0, wrows + 8, kb);  // k 0: rows 8..11 into a, row by row
      fp8v_store4<4>(bk, b, l5, k == 0, wrows + 12, kb);
    }
  }
}

// EXTRA: threads t < 64 (producer warps 0, 1: whole warps) publish whether stage s's tile has a valid row, before the
// full-barrier arrival that also publishes its row ids (after the stage wait: the consumers have read the old flag).
template <bool EXTRA>
__device__ __forceinline__ void publish_any(uint8_t* smem, int s, int cur, int t) {
  if constexpr (EXTRA) {
    if (t < kBN) {
      const unsigned b = __ballot_sync(0xffffffffu, cur >= 0);
      if ((t & 31) == 0) reinterpret_cast<int*>(smem + Smem::any)[2 * s + (t >> 5)] = b != 0u ? 1 : 0;
    }
  }
}

// Producer thread t (0 .. Cfg::kProducers - 1). Threads t < 64 hold the row ids of tiles j (cur) and j + 1 (nxt).
template <bool FP8, int MODE, bool EXTRA>
__device__ __forceinline__ void producer(uint8_t* smem, const uint8_t* kv_base, const int* idx_row, const int* idx2_row,
                                         const Params& p, const XParams& x, int lo, int n, int t, uint32_t bar_full,
                                         uint32_t bar_empty) {
  int* s_rows = reinterpret_cast<int*>(smem + Smem::rows);
  int* prow = reinterpret_cast<int*>(smem + Smem::prow);
  const int64_t stride = FP8 ? kFp8Row : p.stride_kv * 2;
  const Src<EXTRA> kv{kv_base, stride, x.kv2, FP8 ? kFp8Row : x.stride_kv2, p.n_rows};
  int cur = -1, nxt = -1;
  if (t < kBN && n > 0) cur = row_id<EXTRA>(idx_row, idx2_row, lo * kBN + t, p, x);
  if (t < kBN && n > 1) nxt = row_id<EXTRA>(idx_row, idx2_row, (lo + 1) * kBN + t, p, x);
  for (int j = 0; j < n; ++j) {
    const int s = j % kStages;
    const bool wait = j >= kStages;
    const uint32_t parity = ((j / kStages) - 1) & 1;  // the release of tile j - kStages
    if (t < kBN) prow[(j & 1) * kBN + t] = cur;
    named_bar(kBarProducer, Cfg<FP8>::kProducers);  // row ids of tile j visible to every producer thread
    const int* rows = prow + (j & 1) * kBN;
    uint8_t* stage = smem + Smem::ring + s * kStageBytes;
    if constexpr (MODE == kConsumerOnly) {  // tile 0 into stage 0 once, then row ids and signals only
      if (wait) mbar_wait(bar_empty + 8 * s, parity);
      if (t < kBN) s_rows[s * kBN + t] = cur;
      if (j == 0) {
        if constexpr (FP8) {
          fp8_tile(stage, rows, kv, false, 0, 0, s_rows, cur, t);
        } else {
          issue_bf16_tile(stage, rows, kv, t);
          cp_commit();
          cp_wait_all();
        }
        fence_async_smem();
      }
      mbar_arrive(bar_full + 8 * s);
    } else if constexpr (FP8) {
      fp8_tile(stage, rows, kv, wait, bar_empty + 8 * s, parity, s_rows + s * kBN, cur, t);
      publish_any<EXTRA>(smem, s, cur, t);
      fence_async_smem();
      mbar_arrive(bar_full + 8 * s);
      if (t < kBN && nxt >= 0) {  // tile j + 1's rows into L2 (6 lines of 584 bytes, 8-byte aligned)
        const uint8_t* row = kv.at(nxt);
#pragma unroll
        for (int i = 0; i < 6; ++i) prefetch_l2(row + (i < 5 ? 128 * i : 583));
      }
    } else {
      if (wait) mbar_wait(bar_empty + 8 * s, parity);
      if (t < kBN) s_rows[s * kBN + t] = cur;
      publish_any<EXTRA>(smem, s, cur, t);
      issue_bf16_tile(stage, rows, kv, t);
      cp_async_mbar_arrive(bar_full + 8 * s);
      if (t < kBN && nxt >= 0) {  // tile j + 1's rows into L2 while its stage is still busy (1 KiB, 16-byte aligned:
        const uint8_t* row = kv.at(nxt);  // 8 or 9 lines)
#pragma unroll
        for (int i = 0; i < 9; ++i) prefetch_l2(row + (i < 8 ? 128 * i : 1023));
      }
    }
    if (t < kBN) {
      cur = nxt;
      nxt = j + 2 < n ? row_id<EXTRA>(idx_row, idx2_row, (lo + j + 2) * kBN + t, p, x) : -1;
    }
  }
  if constexpr (!FP8) cp_wait_all();  // no thread exits with copies in flight
}

// ------------------------------------------------------------------------------------------------ consumers

// S_w [64 heads x 32 keys] = Q [64, 512] K[32 w .. 32 w + 31, 512]^T: 32 x m64n32k16 (16 fp32 per thread). Not
// committed.
__device__ __forceinline__ void issue_scores(float* s, uint32_t q_base, uint32_t kv_base, int wg) {
  const uint64_t dq = gmma_desc(q_base, 16, 1024), dk = gmma_desc(kv_base + wg * 32 * 128, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < 32; ++ks) {
    const uint32_t koff = (ks >> 2) * kSub + (ks & 3) * 32;  // sub-tile, then 16 dims = 32 B inside the row
    ws_wgmma_m64n32k16_ss(s, desc_at(dq, koff), desc_at(dk, koff), ks > 0 ? 1 : 0);
  }
}

// O_w += P [64 x 64 keys] (smem, K-major) V [64 keys, dims 256 w .. +255] (MN-major: 4 sub-tiles at LBO). Not
// committed.
__device__ __forceinline__ void issue_pv(float* acc, uint32_t p_base, uint32_t kv_base, int wg) {
  const uint64_t dp = gmma_desc(p_base, 16, 1024), dv = gmma_desc(kv_base + 4 * wg * kSub, kSub, 1024);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) ws3_wgmma_m64n256k16_ss_tb(acc, desc_at(dp, ks * 32), desc_at(dv, ks * 16 * 128), 1);
}

// kOptOneScorer: S [64 heads x 64 keys] = Q [64, 512] K[0 .. 63, 512]^T by one warpgroup: 32 x m64n64k16 (32 fp32 per
// thread). Not committed.
__device__ __forceinline__ void issue_scores64(float* s, uint32_t q_base, uint32_t kv_base) {
  const uint64_t dq = gmma_desc(q_base, 16, 1024), dk = gmma_desc(kv_base, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < 32; ++ks) {
    const uint32_t koff = (ks >> 2) * kSub + (ks & 3) * 32;  // sub-tile, then 16 dims = 32 B inside the row
    ws3_wgmma_m64n64k16_ss(s, desc_at(dq, koff), desc_at(dk, koff), ks > 0 ? 1 : 0);
  }
}

// kOptOneScorer: online softmax update of one tile (base 2) over all 64 keys by warpgroup 0 (thread holds s[4 j +
// {0,1}] at (r0, 8 j + 2 (lane % 4) + {0,1}) and s[4 j + {2,3}] at row r0 + 8, j = 0..7). No exchange: writes P
// (bf16, all 64 columns), and alpha / the new running max of its rows into xr[0 .. 63] / xr[64 .. 127] for warpgroup 1.
template <bool THRESH = false>
__device__ __forceinline__ void softmax_tile64(float* s, float* alpha, float* m_run, float* l_run, const int* rows_t,
                                               float* xr, uint8_t* p_tile, int r0, int lane, float qk_scale) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool ok = rows_t[8 * j + 2 * (lane & 3) + e] >= 0;
      // THRESH: raw scores (the scale is folded into exp2's FFMA below; max commutes with a positive scale)
      s[4 * j + e] = ok ? (THRESH ? s[4 * j + e] : s[4 * j + e] * qk_scale) : -INFINITY;
      s[4 * j + 2 + e] = ok ? (THRESH ? s[4 * j + 2 + e] : s[4 * j + 2 + e] * qk_scale) : -INFINITY;
      mx[0] = fmaxf(mx[0], s[4 * j + e]);
      mx[1] = fmaxf(mx[1], s[4 * j + 2 + e]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
    if constexpr (THRESH) mx[h] *= qk_scale;
    // THRESH: the running max moves only when the tile's max passes it by more than kThreshLog2 (P <= 2^8 in between;
    // alpha == 1 exactly otherwise, so the lazy O rescale skips the warp)
    const float m_new = THRESH ? (mx[h] > m_run[h] + kThreshLog2 ? mx[h] : m_run[h]) : fmaxf(m_run[h], mx[h]);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing valid yet: any finite shift works
    alpha[h] = exp2f(m_run[h] - m_use);
    l_run[h] *= alpha[h];
    m_run[h] = m_new;
    mx[h] = m_use;
  }
  if ((lane & 3) == 0) {
    xr[r0] = alpha[0];
    xr[r0 + 8] = alpha[1];
    xr[64 + r0] = m_run[0];
    xr[64 + r0 + 8] = m_run[1];
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float a0 = s[4 * j + 2 * h], a1 = s[4 * j + 2 * h + 1];
      const float p0 = exp2f(THRESH ? fmaf(a0, qk_scale, -mx[h]) : a0 - mx[h]);
      const float p1 = exp2f(THRESH ? fmaf(a1, qk_scale, -mx[h]) : a1 - mx[h]);
      l_run[h] += p0 + p1;
      const int r = r0 + 8 * h;
      const __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
      *reinterpret_cast<__nv_bfloat162*>(p_tile + r * 128 + (((col >> 3) ^ (r & 7)) << 4) + (col & 7) * 2) = pb;
    }
  }
}

// Online softmax update of one tile (base 2) for this warpgroup's 32 keys. Thread holds s[4 j + {0,1}] at (r0,
// 32 wg + 8 j + 2 (lane % 4) + {0, 1}) and s[4 j + {2,3}] at row r0 + 8. The row max is exchanged with the other
// warpgroup through red (one named barrier): both then hold the same running max, alpha and P scale. P (bf16) goes
// to the shared P tile (this warpgroup's 32 columns); l_run keeps this warpgroup's partial row sums.
__device__ __forceinline__ void softmax_tile(float* s, float* alpha, float* m_run, float* l_run, const int* rows_t,
                                             float* red, uint8_t* p_tile, int wg, int r0, int lane, float qk_scale) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool ok = rows_t[32 * wg + 8 * j + 2 * (lane & 3) + e] >= 0;
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
  }
  if ((lane & 3) == 0) {
    red[wg * 64 + r0] = mx[0];
    red[wg * 64 + r0 + 8] = mx[1];
  }
  named_bar(kBarConsumers, kConsumers);  // both warpgroups' row maxima
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    const float m_new = fmaxf(m_run[h], fmaxf(red[r], red[64 + r]));
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing valid yet: any finite shift works
    alpha[h] = exp2f(m_run[h] - m_use);
    l_run[h] *= alpha[h];
    m_run[h] = m_new;
    mx[h] = m_use;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int col = 32 * wg + 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float p0 = exp2f(s[4 * j + 2 * h] - mx[h]), p1 = exp2f(s[4 * j + 2 * h + 1] - mx[h]);
      l_run[h] += p0 + p1;
      const int r = r0 + 8 * h;
      const __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
      *reinterpret_cast<__nv_bfloat162*>(p_tile + r * 128 + (((col >> 3) ^ (r & 7)) << 4) + (col & 7) * 2) = pb;
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

// Row sums of both warpgroups (lsum, one named barrier), then normalise and store: out / lse (one split) or the fp32
// partials (split-KV). Both warpgroups hold the same running max.
__device__ __forceinline__ void finish(const float* acc, const float* m_run, float* l_run, float* lsum,
                                       const float* sink, __nv_bfloat16* out, float* lse, float* part_o,
                                       float* part_lse, const Params& p, int64_t tok, int hb, int split, int wg, int r0,
                                       int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 2);
  }
  if ((lane & 3) == 0) {
    lsum[wg * 64 + r0] = l_run[0];
    lsum[wg * 64 + r0 + 8] = l_run[1];
  }
  named_bar(kBarConsumers, kConsumers);
  const int col0 = 256 * wg + 2 * (lane & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = hb * kH + r0 + 8 * h;
    const float m = m_run[h];
    const float l_tot = lsum[r0 + 8 * h] + lsum[64 + r0 + 8 * h];
    if (p.num_splits == 1) {
      float m_f = m, sink_h = 0.f, sink2 = 0.f;
      if (p.has_sink) {
        sink_h = sink[head];
        sink2 = sink_h * 1.4426950408889634f;
        m_f = fmaxf(m, sink2);
      }
      if (m_f == -INFINITY) m_f = 0.f;
      const float a = exp2f(m - m_f);
      float l_f = l_tot * a;
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
      const bool has = l_tot > 0.f;
      const float so = has ? 1.f / l_tot : 0.f;
      const int64_t prow = (tok * p.num_splits + split) * (int64_t)p.H + head;
      float* orow = part_o + prow * kD;
#pragma unroll
      for (int jn = 0; jn < 32; ++jn) {
        *reinterpret_cast<float2*>(orow + col0 + 8 * jn) =
            make_float2(acc[4 * jn + 2 * h] * so, acc[4 * jn + 2 * h + 1] * so);
      }
      if (wg == 0 && (lane & 3) == 0) part_lse[prow] = has ? m + log2f(l_tot) : -INFINITY;
    }
  }
}

// Softmax of tile i (S_i complete in s), O *= alpha_i, P_i published (barrier), O += P_i V_i; then stage i released.
// Q [64 heads, 512] of (tok, head block hb) -> swizzled smem by the 256 consumer threads (one commit group).
__device__ __forceinline__ void issue_q(const __nv_bfloat16* q, const Params& p, int64_t tok, int hb, uint32_t q_base,
                                        int tid) {
  const __nv_bfloat16* qt = q + tok * p.stride_qt + (int64_t)hb * kH * p.stride_qh;
  const int c = tid & 63;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int r = (tid >> 6) + 4 * i;
    cp_async16(q_base + swz(r, c, kH), qt + (int64_t)r * p.stride_qh + c * 8, true);
  }
  cp_commit();
}

// after_p() runs right after the P barrier (both warpgroups' scores of tile i done: ws3p issues the next item's Q
// load there; ws3 passes a no-op).
// softmax_issue_pv: everything up to P_i V_i issued and committed (not waited for). LAZY: kOptLazy (ws3p options).
template <bool LAZY, class AfterP>
__device__ __forceinline__ void softmax_issue_pv(float* s, float* acc, float* m_run, float* l_run, uint8_t* smem,
                                                 int i, uint32_t kv_base, int wg, int r0, int lane, float qk_scale,
                                                 AfterP after_p) {
  const int st = i % kStages;
  const int* s_rows = reinterpret_cast<const int*>(smem + Smem::rows) + st * kBN;
  float* red = reinterpret_cast<float*>(smem + Smem::red) + (i & 1) * 128;
  uint8_t* p_tile = smem + Smem::p + (i & 1) * kSub;
  float alpha[2];
  softmax_tile(s, alpha, m_run, l_run, s_rows, red, p_tile, wg, r0, lane, qk_scale);
  if constexpr (LAZY) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) rescale_o(acc, alpha);
  } else {
    rescale_o(acc, alpha);
  }
  fence_async_smem();                    // P (generic stores) -> wgmma (async proxy)
  named_bar(kBarConsumers, kConsumers);  // both halves of P_i written
  after_p();
  reg_fence<128>(acc);
  wg_arrive();
  issue_pv(acc, smem_u32(p_tile), kv_base, wg);
  wg_commit();
}

template <class AfterP>
__device__ __forceinline__ void softmax_pv(float* s, float* acc, float* m_run, float* l_run, uint8_t* smem, int i,
                                           uint32_t kv_base, uint32_t bar_empty, int wg, int r0, int lane,
                                           float qk_scale, AfterP after_p) {
  softmax_issue_pv<false>(s, acc, m_run, l_run, smem, i, kv_base, wg, r0, lane, qk_scale, after_p);
  wg_wait<0>();
  reg_fence<128>(acc);
  mbar_arrive(bar_empty + 8 * (i % kStages));
}

// Consumer warpgroups. Per tile i: [S_i complete] softmax_i (max barrier), O *= alpha_i, P barrier, P_i V_i; stage i
// released as soon as P_i V_i is done, BEFORE waiting for tile i + 1: with two stages the gather of tile i + 2 can
// then overlap the wait for tile i + 1 (the producer is the bottleneck: ws2 producer-only 77 of the serial 92 us).
// The price: the tensor pipe drains between P_i V_i and S_{i+1} (issuing them back to back would tie the release of
// stage i to the arrival of tile i + 1 and serialise the gathers).
template <int MODE, bool EXTRA>
__device__ __forceinline__ void consumer(uint8_t* smem, const __nv_bfloat16* q, const float* sink, __nv_bfloat16* out,
                                         float* lse, float* part_o, float* part_lse, const Params& p, int64_t tok,
                                         int hb, int split, int n, int tid, uint32_t bar_full, uint32_t bar_empty) {
  const int wg = tid >> 7, lane = tid & 31;
  const int r0 = ((tid & 127) >> 5) * 16 + (lane >> 2);
  const uint32_t q_base = smem_u32(smem + Smem::q), ring_base = smem_u32(smem + Smem::ring);
  {  // Q -> smem (both warpgroups), while the producer gathers the first tiles
    issue_q(q, p, tok, hb, q_base, tid);
    cp_wait_all();
    fence_async_smem();
    named_bar(kBarConsumers, kConsumers);
  }
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float s[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) s[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  constexpr uint32_t kStep = MODE == kConsumerOnly ? 0 : kStageBytes;  // consumer-only: always stage 0
  if constexpr (MODE == kProducerOnly) {  // ablation: hand every tile straight back
    for (int i = 0; i < n; ++i) {
      mbar_wait(bar_full + 8 * (i % kStages), (i / kStages) & 1);
      mbar_arrive(bar_empty + 8 * (i % kStages));
    }
    n = 0;
  }
  for (int i = 0; i < n; ++i) {
    const int st = i % kStages;
    mbar_wait(bar_full + 8 * st, (i / kStages) & 1);
    if constexpr (EXTRA) {  // a tile of holes only (same flag for all 256 threads): hand the stage straight back
      const int* any = reinterpret_cast<const int*>(smem + Smem::any) + 2 * st;
      if ((any[0] | any[1]) == 0) {
        mbar_arrive(bar_empty + 8 * st);
        continue;
      }
    }
    fence_async_smem();
    reg_fence<16>(s);
    wg_arrive();
    issue_scores(s, q_base, ring_base + st * kStep, wg);
    wg_commit();
    wg_wait<0>();
    reg_fence<16>(s);
    softmax_pv(s, acc, m_run, l_run, smem, i, ring_base + st * kStep, bar_empty, wg, r0, lane, p.qk_scale, [] {});
  }
  finish(acc, m_run, l_run, reinterpret_cast<float*>(smem + Smem::lsum), sink, out, lse, part_o, part_lse, p, tok, hb,
         split, wg, r0, lane);
}

// ------------------------------------------------------------------------------------------------ kernel

// Thread 0 initialises the ring's full (PRODUCERS arrivals) / empty (consumer arrivals) barriers; then the CTA syncs.
template <int PRODUCERS>
__device__ __forceinline__ void init_ring_barriers(uint32_t bar_full, uint32_t bar_empty, int tid) {
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full + 8 * s, PRODUCERS);
      mbar_init(bar_empty + 8 * s, kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
}

template <bool FP8, int MODE, bool EXTRA>
__global__ void __launch_bounds__(Cfg<FP8>::kThreads, 1)
    ws3_decode_kernel(const __nv_bfloat16* __restrict__ q, const uint8_t* __restrict__ kv, const int* __restrict__ idx,
                      const float* __restrict__ sink, __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                      float* __restrict__ part_o, float* __restrict__ part_lse, Params p, XParams x) {
  using C = Cfg<FP8>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Dynamic shared memory is only 16-byte aligned by contract: align to 1 KiB (the swizzle atom) by hand.
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t bar_full = smem_u32(smem + Smem::bars), bar_empty = bar_full + 8 * kStages;
  const int tid = threadIdx.x;
  const int num_hb = p.H / kH;
  const int hb = blockIdx.x % num_hb;
  const int split = (blockIdx.x / num_hb) % p.num_splits;
  const int64_t tok = blockIdx.x / (num_hb * p.num_splits);
  const int n_tiles = (p.topk + (EXTRA ? x.topk2 : 0) + kBN - 1) / kBN;  // EXTRA: main list, then extra list
  const int lo = split * p.tiles_per_split;
  const int n = max(min(lo + p.tiles_per_split, n_tiles) - lo, 0);
  init_ring_barriers<C::kProducers>(bar_full, bar_empty, tid);
  if (tid >= kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs));
    const int* idx2_row = EXTRA ? x.idx2 + tok * x.stride_it2 : nullptr;
    producer<FP8, MODE, EXTRA>(smem, kv, idx + tok * p.stride_it, idx2_row, p, x, lo, n, tid - kConsumers, bar_full,
                               bar_empty);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
    consumer<MODE, EXTRA>(smem, q, sink, out, lse, part_o, part_lse, p, tok, hb, split, n, tid, bar_full, bar_empty);
  }
}

// Launch a ws3 / ws3p kernel on LaunchArgs' pointers and Params, then the kernel's own last argument (XParams / items).
template <class Kern, class Tail>
static int launch_kernel(Kern kern, int64_t grid, int threads, int smem, cudaStream_t stream, const LaunchArgs& a,
                         const Tail& tail) {
  kern<<<(unsigned)grid, threads, smem, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(a.q), reinterpret_cast<const uint8_t*>(a.kv),
      reinterpret_cast<const int*>(a.idx), reinterpret_cast<const float*>(a.sink),
      reinterpret_cast<__nv_bfloat16*>(a.out), reinterpret_cast<float*>(a.lse), reinterpret_cast<float*>(a.part_o),
      reinterpret_cast<float*>(a.part_lse), a.p, tail);
  return (int)cudaGetLastError();
}

template <bool FP8, int MODE, bool EXTRA = false>
static int launch_impl(const LaunchArgs& a, cudaStream_t stream, const XParams& x = XParams{}) {
  const int smem = (EXTRA ? Smem::total_extra : Smem::total) + 1024;  // + alignment slack
  auto kern = ws3_decode_kernel<FP8, MODE, EXTRA>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return (int)e;
  const Params& p = a.p;
  const int64_t grid = (int64_t)a.num_tokens * p.num_splits * (p.H / kH);
  if (grid <= 0) return 0;
  return launch_kernel(kern, grid, Cfg<FP8>::kThreads, smem, stream, a, x);
}

template <bool FP8>
static int launch_mode(const LaunchArgs& a, int mode, cudaStream_t s) {
  switch (mode) {
    case kFull: return launch_impl<FP8, kFull>(a, s);
    case kProducerOnly: return launch_impl<FP8, kProducerOnly>(a, s);
    case kConsumerOnly: return launch_impl<FP8, kConsumerOnly>(a, s);
    default: return (int)cudaErrorInvalidValue;
  }
}

// ------------------------------------------------------------------------------------------------ ws3p (persistent)
// ws3p (session 5 round 5, GPU-run in s6): the same per-tile work as ws3 (kFull, single cache, both formats) in a
// persistent grid of min(#SMs or max_ctas, work items) CTAs. Work item w = (token, split, head block), numbered as
// ws3's blockIdx.x; CTA b takes items b, b + G, b + 2 G, ... (static stride: every item costs the same tiles but the
// last split's, so a dynamic counter would balance nothing and would need a zeroed global counter per launch, i.e.
// a memset or a self-resetting protocol, and a broadcast through shared memory per item).
// What persistence buys (one CTA per SM: 211 KiB shared memory, 384 threads): barrier init once per CTA; the
// producer's ring runs straight on from one item into the next (a single tile counter g across items for stages and
// parities), so the next item's first two tiles land while the consumers finish the current item and store its
// output; and the next item's Q [64, 512] bf16 is loaded into the Q buffer as soon as the last tile's scores are done
// (after the P barrier of the last tile, which both warpgroups reach only after their last Q read), so its load
// overlaps the last P V and the output store. A second Q buffer does not fit: Q 64 + ring 2 x 64 + P 16 KiB + 1 KiB
// tables = 209 KiB, + 64 KiB = 273 KiB > 227 KiB. Ablation modes and the extra cache are ws3's only.

// The split-KV coordinates of work item w (ws3's blockIdx.x decomposition) and its tile range [lo, lo + n).
struct Item {
  int64_t tok;
  int hb, split, lo, n;
};
__device__ __forceinline__ Item item_of(int64_t w, const Params& p, int n_tiles) {
  const int num_hb = p.H / kH;
  Item it;
  it.hb = (int)(w % num_hb);
  it.split = (int)((w / num_hb) % p.num_splits);
  it.tok = w / ((int64_t)num_hb * p.num_splits);
  it.lo = it.split * p.tiles_per_split;
  it.n = max(min(it.lo + p.tiles_per_split, n_tiles) - it.lo, 0);
  return it;
}

// The producer's position in the CTA's tile stream: tile j of item w (valid: w < items). Items without tiles are
// skipped (the consumers still run their epilogue; only topk = 0 has them).
struct Cursor {
  int64_t w, tok;
  int j, lo, n;
};
__device__ __forceinline__ void cursor_settle(Cursor& c, const Params& p, int n_tiles, int64_t items) {
  while (c.w < items && c.j >= c.n) {
    c.w += gridDim.x;
    c.j = 0;
    if (c.w < items) {
      const Item it = item_of(c.w, p, n_tiles);
      c.tok = it.tok, c.lo = it.lo, c.n = it.n;
    }
  }
}
__device__ __forceinline__ Cursor cursor_first(const Params& p, int n_tiles, int64_t items) {
  Cursor c{(int64_t)blockIdx.x, 0, 0, 0, 0};
  const Item it = item_of(c.w, p, n_tiles);
  c.tok = it.tok, c.lo = it.lo, c.n = it.n;
  cursor_settle(c, p, n_tiles, items);
  return c;
}
__device__ __forceinline__ void cursor_next(Cursor& c, const Params& p, int n_tiles, int64_t items) {
  ++c.j;
  cursor_settle(c, p, n_tiles, items);
}
// Row id of thread t's entry of the cursor's tile (-1: hole or past the stream).
__device__ __forceinline__ int cursor_row(const Cursor& c, const int* idx, const Params& p, int64_t items, int t) {
  if (c.w >= items) return -1;
  return load_row_id(idx + c.tok * p.stride_it, (c.lo + c.j) * kBN + t, p.topk, p.n_rows);
}

// ws3's producer (kFull, single cache) over the CTA's whole tile stream: tile g of the stream into stage g % kStages;
// the row ids of tile g + 1 (which may be the next item's first tile) are loaded one tile ahead and its rows
// prefetched into L2, as ws3 does inside one item.
template <bool FP8, int OPT>
__device__ __forceinline__ void producer_p(uint8_t* smem, const uint8_t* kv_base, const int* idx, const Params& p,
                                           int64_t items, int t, uint32_t bar_full, uint32_t bar_empty) {
  int* s_rows = reinterpret_cast<int*>(smem + Smem::rows);
  int* prow = reinterpret_cast<int*>(smem + Smem::prow);
  const Src<false> kv{kv_base, FP8 ? kFp8Row : p.stride_kv * 2, nullptr, 0, 0};
  const int n_tiles = (p.topk + kBN - 1) / kBN;
  Cursor a = cursor_first(p, n_tiles, items);  // tile g
  Cursor b = a;                                // tile g + 1
  cursor_next(b, p, n_tiles, items);
  int cur = t < kBN ? cursor_row(a, idx, p, items, t) : -1;
  int nxt = t < kBN ? cursor_row(b, idx, p, items, t) : -1;
  for (uint32_t g = 0; a.w < items; ++g) {
    const int s = g % kStages;
    const bool wait = g >= kStages;
    const uint32_t parity = ((g / kStages) - 1) & 1;  // the release of tile g - kStages
    if (t < kBN) prow[(g & 1) * kBN + t] = cur;
    named_bar(kBarProducer, Cfg<FP8>::kProducers);  // row ids of tile g visible to every producer thread
    const int* rows = prow + (g & 1) * kBN;
    uint8_t* stage = smem + Smem::ring + s * kStageBytes;
    if constexpr (FP8) {
      if constexpr ((OPT & kOptVec) != 0) {
        static_assert((OPT & kOptWideFp8) == 0, "kOptVec has its own batching (88 producer registers)");
        if constexpr ((OPT & kOptVecWide) != 0) {
          fp8v_tile<3>(stage, rows, kv_base, wait, bar_empty + 8 * s, parity, s_rows + s * kBN, cur, t);
        } else {
          fp8v_tile(stage, rows, kv_base, wait, bar_empty + 8 * s, parity, s_rows + s * kBN, cur, t);
        }
      } else {
        fp8_tile<false, (OPT & kOptWideFp8) != 0>(stage, rows, kv, wait, bar_empty + 8 * s, parity, s_rows + s * kBN,
                                                  cur, t);
      }
      fence_async_smem();
      mbar_arrive(bar_full + 8 * s);
      if (t < kBN && nxt >= 0) {
        const uint8_t* row = kv.at(nxt);
#pragma unroll
        for (int i = 0; i < 6; ++i) prefetch_l2(row + (i < 5 ? 128 * i : 583));
      }
    } else {
      if (wait) mbar_wait(bar_empty + 8 * s, parity);
      if (t < kBN) s_rows[s * kBN + t] = cur;
      issue_bf16_tile(stage, rows, kv, t);
      cp_async_mbar_arrive(bar_full + 8 * s);
      if (t < kBN && nxt >= 0) {
        const uint8_t* row = kv.at(nxt);
#pragma unroll
        for (int i = 0; i < 9; ++i) prefetch_l2(row + (i < 8 ? 128 * i : 1023));
      }
    }
    a = b;
    cursor_next(b, p, n_tiles, items);
    cur = nxt;
    nxt = t < kBN ? cursor_row(b, idx, p, items, t) : -1;
  }
  if constexpr (!FP8) cp_wait_all();  // no thread exits with copies in flight
}

// A persistent consumer's item start: its Q [64 heads, 512] in place in shared memory (loaded now unless the previous
// item's last tile already issued it), visible to both consumer warpgroups.
__device__ __forceinline__ void item_q_ready(const __nv_bfloat16* q, const Params& p, const Item& it, uint32_t q_base,
                                             int tid, bool q_loaded) {
  if (!q_loaded) issue_q(q, p, it.tok, it.hb, q_base, tid);
  cp_wait_all();
  fence_async_smem();
  named_bar(kBarConsumers, kConsumers);  // Q of this item in place (also: the last item's lsum reads are done)
}

// Tile g's places in the one-scorer loops: ring stage, its smem address, its row ids, the [alpha 64][running max 64]
// hand-over and the P tile (both double-buffered by tile parity).
struct TileSlots {
  int st;
  uint32_t kv_base;
  const int* s_rows;
  float* xr;
  uint8_t* p_tile;
};
__device__ __forceinline__ TileSlots tile_slots(uint8_t* smem, uint32_t ring_base, uint32_t g) {
  const int st = g % kStages;
  return {st, ring_base + st * kStageBytes, reinterpret_cast<const int*>(smem + Smem::rows) + st * kBN,
          reinterpret_cast<float*>(smem + Smem::red) + (g & 1) * 128, smem + Smem::p + (g & 1) * kSub};
}

// ws3's consumers over the CTA's items: per item, Q (loaded by the previous item's last tile, else now), the tiles of
// the stream in order (g counts across items, as the producer's), then the epilogue (out / lse or the partials).
template <int OPT>
__device__ __forceinline__ void consumer_p(uint8_t* smem, const __nv_bfloat16* q, const float* sink, __nv_bfloat16* out,
                                           float* lse, float* part_o, float* part_lse, const Params& p, int64_t items,
                                           int tid, uint32_t bar_full, uint32_t bar_empty) {
  const int wg = tid >> 7, lane = tid & 31;
  const int r0 = ((tid & 127) >> 5) * 16 + (lane >> 2);
  const uint32_t q_base = smem_u32(smem + Smem::q), ring_base = smem_u32(smem + Smem::ring);
  const int n_tiles = (p.topk + kBN - 1) / kBN;
  uint32_t g = 0;
  bool q_loaded = false;
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const Item it = item_of(w, p, n_tiles);
    const int64_t wn = w + gridDim.x;
    const Item nx = item_of(wn < items ? wn : w, p, n_tiles);
    item_q_ready(q, p, it, q_base, tid, q_loaded);
    q_loaded = false;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    bool pre = false;  // kOptEarlyS: S of tile g already issued behind the previous P V, and complete
    for (int i = 0; i < it.n; ++i, ++g) {
      const int st = g % kStages;
      if (!pre) {
        mbar_wait(bar_full + 8 * st, (g / kStages) & 1);
        fence_async_smem();
        reg_fence<16>(s);
        wg_arrive();
        issue_scores(s, q_base, ring_base + st * kStageBytes, wg);
        wg_commit();
        wg_wait<0>();
        reg_fence<16>(s);
      }
      pre = false;
      const bool q_next = i == it.n - 1 && wn < items;
      softmax_issue_pv<(OPT & kOptLazy) != 0>(
          s, acc, m_run, l_run, smem, (int)g, ring_base + st * kStageBytes, wg, r0, lane, p.qk_scale,
          [&] {  // the last read of this item's Q is done: the next item's Q load overlaps P @ V
            if (q_next) issue_q(q, p, nx.tok, nx.hb, q_base, tid);
          });
      q_loaded = q_next;
      if constexpr ((OPT & kOptEarlyS) != 0) {
        if (i + 1 < it.n) {  // tile g + 1 is this item's (its Q is in place): issue its scores now if it has landed
          const int sn = (g + 1) % kStages;
          const bool landed = mbar_test(bar_full + 8 * sn, ((g + 1) / kStages) & 1);
          pre = wg == 0 ? wg_all<kBarWg0>(landed) : wg_all<kBarWg0 + 1>(landed);
          if (pre) {
            fence_async_smem();
            reg_fence<16>(s);
            wg_arrive();
            issue_scores(s, q_base, ring_base + sn * kStageBytes, wg);
            wg_commit();
            wg_wait<1>();  // P_g V_g done (groups complete in order): stage g is free, S_{g+1} may still run
            reg_fence<128>(acc);
            mbar_arrive(bar_empty + 8 * st);
            wg_wait<0>();
            reg_fence<16>(s);
            continue;
          }
        }
      }
      wg_wait<0>();
      reg_fence<128>(acc);
      mbar_arrive(bar_empty + 8 * st);
    }
    finish(acc, m_run, l_run, reinterpret_cast<float*>(smem + Smem::lsum), sink, out, lse, part_o, part_lse, p, it.tok,
           it.hb, it.split, wg, r0, lane);
  }
}

// kOptOneScorer consumers (the item loop, Q hand-over and epilogue of consumer_p): per tile warpgroup 0 scores all 64
// keys and runs the softmax (softmax_tile64), then one named barrier publishes P / alpha / the running max; warpgroup 1
// rescales its O half with the published alpha; both run their P @ V and release the stage. LAZY: kOptLazy's skip.
template <bool LAZY>
__device__ __forceinline__ void lazy_rescale(float* acc, const float* alpha) {
  if constexpr (LAZY) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) rescale_o(acc, alpha);
  } else {
    rescale_o(acc, alpha);
  }
}

// Warpgroup 0 of the one-scorer loops, S_g complete in s: softmax_g (P_g, alpha_g, m_g into shared memory), its O half
// rescaled, then P_g / alpha_g / m_g published to warpgroup 1 (named barrier).
template <bool LAZY, bool THRESH = false>
__device__ __forceinline__ void wg0_softmax_publish(float* s, float* acc, float* alpha, float* m_run, float* l_run,
                                                    const int* s_rows, float* xr, uint8_t* p_tile, int r0, int lane,
                                                    float qk_scale) {
  softmax_tile64<THRESH>(s, alpha, m_run, l_run, s_rows, xr, p_tile, r0, lane, qk_scale);
  lazy_rescale<LAZY>(acc, alpha);
  fence_async_smem();                    // P (generic stores) -> wgmma (async proxy)
  named_bar(kBarConsumers, kConsumers);  // P_g, alpha_g, m_g published
}

// Warpgroup 1 of the one-scorer loops: wait for warpgroup 0's P_g / alpha_g / m_g (named barrier), take its rows'
// alpha and running max from xr, rescale its O half.
template <bool LAZY>
__device__ __forceinline__ void wg1_take_alpha(float* acc, float* alpha, float* m_run, const float* xr, int r0) {
  named_bar(kBarConsumers, kConsumers);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    alpha[h] = xr[r0 + 8 * h];
    m_run[h] = xr[64 + r0 + 8 * h];
  }
  lazy_rescale<LAZY>(acc, alpha);
}

// (No kOptEarlyS form: warpgroup 0 holding 32 score registers while its P @ V runs spills at 208 registers.)
template <bool LAZY>
__device__ __forceinline__ void consumer_p1(uint8_t* smem, const __nv_bfloat16* q, const float* sink, __nv_bfloat16* out,
                                            float* lse, float* part_o, float* part_lse, const Params& p, int64_t items,
                                            int tid, uint32_t bar_full, uint32_t bar_empty) {
  const int wg = tid >> 7, lane = tid & 31;
  const int r0 = ((tid & 127) >> 5) * 16 + (lane >> 2);
  const uint32_t q_base = smem_u32(smem + Smem::q), ring_base = smem_u32(smem + Smem::ring);
  const int n_tiles = (p.topk + kBN - 1) / kBN;
  uint32_t g = 0;
  bool q_loaded = false;
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const Item it = item_of(w, p, n_tiles);
    const int64_t wn = w + gridDim.x;
    const Item nx = item_of(wn < items ? wn : w, p, n_tiles);
    item_q_ready(q, p, it, q_base, tid, q_loaded);
    q_loaded = false;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // warpgroup 1: l_run stays 0 (finish adds it)
    for (int i = 0; i < it.n; ++i, ++g) {
      const auto [st, kv_base, s_rows, xr, p_tile] = tile_slots(smem, ring_base, g);
      float alpha[2];
      mbar_wait(bar_full + 8 * st, (g / kStages) & 1);
      if (wg == 0) {
        fence_async_smem();
        reg_fence<32>(s);
        wg_arrive();
        issue_scores64(s, q_base, kv_base);
        wg_commit();
        wg_wait<0>();
        reg_fence<32>(s);
        wg0_softmax_publish<LAZY>(s, acc, alpha, m_run, l_run, s_rows, xr, p_tile, r0, lane, p.qk_scale);
      } else {
        wg1_take_alpha<LAZY>(acc, alpha, m_run, xr, r0);
      }
      if (i == it.n - 1 && wn < items) {  // the last read of this item's Q is done: the next item's Q overlaps P V
        issue_q(q, p, nx.tok, nx.hb, q_base, tid);
        q_loaded = true;
      }
      reg_fence<128>(acc);
      wg_arrive();
      issue_pv(acc, smem_u32(p_tile), kv_base, wg);
      wg_commit();
      wg_wait<0>();
      reg_fence<128>(acc);
      mbar_arrive(bar_empty + 8 * st);
    }
    finish(acc, m_run, l_run, reinterpret_cast<float*>(smem + Smem::lsum), sink, out, lse, part_o, part_lse, p, it.tok,
           it.hb, it.split, wg, r0, lane);
  }
}

// kOptOverlap + kOptOvlAdapt consumers (consumer_p1's item loop, barriers and epilogue; one function per warpgroup
// WG, each after its own setmaxnreg). Warpgroup 0 issues the next tile's scores S_{g+1} (same item only: same Q)
// before softmax_g if tile g + 1 has ALREADY landed (a non-blocking test voted over the warpgroup: the .sync.aligned
// wgmma need one decision), else behind P_g V_g if it has landed by then, else at the top of iteration g + 1 as
// ws3p1 does (after the release of stage g, so the producer is never held up). Behind P_g V_g: wait_group 1 releases
// stage g as soon as P_g V_g is done, then wait_group 0 (constant counts on each path). S_{g+1} lands in sn and is
// moved to s after the waits. Warpgroup 1 as in consumer_p1.
// Warpgroup 0: wait for tile gn, then issue S_gn = Q K_gn^T into sn (32 x m64n64k16), committed (not waited for).
__device__ __forceinline__ void issue_next_scores(float* sn, uint32_t q_base, uint32_t ring_base, uint32_t bar_full,
                                                  uint32_t gn) {
  const int sn_st = gn % kStages;
  mbar_wait(bar_full + 8 * sn_st, (gn / kStages) & 1);
  fence_async_smem();
  reg_fence<32>(sn);
  wg_arrive();
  issue_scores64(sn, q_base, ring_base + sn_st * kStageBytes);
  wg_commit();
}
// Whether tile gn has landed, voted over warpgroup 0 (AND: issue only when every thread sees it).
__device__ __forceinline__ bool tile_landed_wg0(uint32_t bar_full, uint32_t gn) {
  return wg_all<kBarWg0>(mbar_test(bar_full + 8 * (gn % kStages), (gn / kStages) & 1));
}

template <bool LAZY, int WG, bool THRESH = false>
__device__ __forceinline__ void consumer_p1o(uint8_t* smem, const __nv_bfloat16* q, const float* sink,
                                             __nv_bfloat16* out, float* lse, float* part_o, float* part_lse,
                                             const Params& p, int64_t items, int tid, uint32_t bar_full,
                                             uint32_t bar_empty) {
  const int lane = tid & 31;
  const int r0 = ((tid & 127) >> 5) * 16 + (lane >> 2);
  const uint32_t q_base = smem_u32(smem + Smem::q), ring_base = smem_u32(smem + Smem::ring);
  const int n_tiles = (p.topk + kBN - 1) / kBN;
  uint32_t g = 0;
  bool q_loaded = false;
  float s[32], sn[32];  // warpgroup 0: S_g (softmax input), S_{g+1} (in flight)
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = sn[i] = 0.f;
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const Item it = item_of(w, p, n_tiles);
    const int64_t wn = w + gridDim.x;
    item_q_ready(q, p, it, q_base, tid, q_loaded);
    q_loaded = false;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // warpgroup 1: l_run stays 0 (finish adds it)
    bool have = false;  // warpgroup 0: S_g already in s (issued early, complete)
    for (int i = 0; i < it.n; ++i, ++g) {
      const auto [st, kv_base, s_rows, xr, p_tile] = tile_slots(smem, ring_base, g);
      const bool more = i + 1 < it.n;  // tile g + 1 is this item's (same Q): its scores may go out early
      bool pre = false;                // warpgroup 0: S_{g+1} issued in this iteration
      float alpha[2];
      mbar_wait(bar_full + 8 * st, (g / kStages) & 1);
      if constexpr (WG == 0) {
        if (!have) {  // the item's first S, or S_g could not go out early: ws3p1's order (every S goes into sn)
          issue_next_scores(sn, q_base, ring_base, bar_full, g);
          wg_wait<0>();
          reg_fence<32>(sn);
#pragma unroll
          for (int k = 0; k < 32; ++k) s[k] = sn[k];
        }
        if (more) pre = tile_landed_wg0(bar_full, g + 1);
        if (pre) issue_next_scores(sn, q_base, ring_base, bar_full, g + 1);
        wg0_softmax_publish<LAZY, THRESH>(s, acc, alpha, m_run, l_run, s_rows, xr, p_tile, r0, lane, p.qk_scale);
      } else {
        wg1_take_alpha<LAZY>(acc, alpha, m_run, xr, r0);
      }
      if (i == it.n - 1 && wn < items) {  // the last read of this item's Q is done: the next item's Q overlaps P V
        // (tid re-read, opaque: else its 16 row addresses are computed at the item's start and spilled)
        uint32_t tx;
        asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tx));
        const Item nx = item_of(wn, p, n_tiles);
        issue_q(q, p, nx.tok, nx.hb, q_base, (int)tx);
        q_loaded = true;
      }
      reg_fence<128>(acc);
      wg_arrive();
      issue_pv(acc, smem_u32(p_tile), kv_base, WG);
      wg_commit();
      bool late = false;  // warpgroup 0: S_{g+1} issued behind P_g V_g
      if constexpr (WG == 0) {
        if (more && !pre) late = tile_landed_wg0(bar_full, g + 1);
        if (late) {
          issue_next_scores(sn, q_base, ring_base, bar_full, g + 1);
          wg_wait<1>();  // P_g V_g done (groups complete in order): stage g is free, S_{g+1} may still run
          reg_fence<128>(acc);
          mbar_arrive(bar_empty + 8 * st);
        }
      }
      wg_wait<0>();  // P_g V_g (and warpgroup 0's S_{g+1}) complete
      reg_fence<128>(acc);
      if constexpr (WG == 0) {
        reg_fence<32>(sn);
        if (pre || late) {
#pragma unroll
          for (int k = 0; k < 32; ++k) s[k] = sn[k];
        }
        have = pre || late;
      }
      if (!late) mbar_arrive(bar_empty + 8 * st);
    }
    finish(acc, m_run, l_run, reinterpret_cast<float*>(smem + Smem::lsum), sink, out, lse, part_o, part_lse, p, it.tok,
           it.hb, it.split, WG, r0, lane);
  }
}

// kOptOverlap + kOptOvlAdapt's register split (setmaxnreg per warpgroup; .inc only takes what the producer's .dec
// gave back).
constexpr int kOvlRegsWg0 = 240, kOvlRegsWg1 = 176;
static_assert(128 * 88 + 128 * kOvlRegsWg0 + 128 * kOvlRegsWg1 == 384 * 168, "setmaxnreg budget");
// kOptVecWide: 16 more producer registers (12 FP8 rows in flight), from warpgroup 1 (O half + fragments)
constexpr int kVwRegsWg0 = 232;
constexpr int kVwRegsProd = 104, kVwRegsWg1 = 168;  // (m64n256k16 needs >= 154 in warpgroup 1)
static_assert(128 * kVwRegsProd + 128 * kVwRegsWg0 + 128 * kVwRegsWg1 == 384 * 168, "setmaxnreg budget");

template <bool FP8, int OPT>
__global__ void __launch_bounds__(Cfg<FP8>::kThreads, 1)
    ws3p_decode_kernel(const __nv_bfloat16* __restrict__ q, const uint8_t* __restrict__ kv, const int* __restrict__ idx,
                       const float* __restrict__ sink, __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                       float* __restrict__ part_o, float* __restrict__ part_lse, Params p, int64_t items) {
  using C = Cfg<FP8, FP8 && (OPT & kOptWideFp8) != 0>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // 1 KiB alignment (as ws3)
  const uint32_t bar_full = smem_u32(smem + Smem::bars), bar_empty = bar_full + 8 * kStages;
  const int tid = threadIdx.x;
  init_ring_barriers<C::kProducers>(bar_full, bar_empty, tid);  // (tid 0's fence.mbarrier_init covers both)
  constexpr bool kVw = (OPT & kOptVecWide) != 0;
  static_assert(!kVw || (OPT & kOptOverlap) != 0, "kOptVecWide: with the overlap builds only (its register split)");
  if (tid >= kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kVw ? kVwRegsProd : C::kProducerRegs));
    producer_p<FP8, OPT>(smem, kv, idx, p, items, tid - kConsumers, bar_full, bar_empty);
  } else if constexpr ((OPT & kOptOverlap) != 0) {
    static_assert((OPT & kOptOneScorer) != 0 && (OPT & (kOptEarlyS | kOptWideFp8)) == 0, "kOptOverlap: ws3p1 only");
    static_assert((OPT & kOptOvlAdapt) != 0, "kOptOverlap: the adaptive form only (the blocking one was removed)");
    constexpr bool kLazy = (OPT & kOptLazy) != 0, kThresh = (OPT & kOptThresh) != 0;
    static_assert(!kThresh || kLazy, "kOptThresh: with kOptLazy (its alpha == 1 tiles are what the lazy skip skips)");
    if (tid < 128) {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kVw ? kVwRegsWg0 : kOvlRegsWg0));
      consumer_p1o<kLazy, 0, kThresh>(smem, q, sink, out, lse, part_o, part_lse, p, items, tid, bar_full, bar_empty);
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kVw ? kVwRegsWg1 : kOvlRegsWg1));
      consumer_p1o<kLazy, 1, kThresh>(smem, q, sink, out, lse, part_o, part_lse, p, items, tid, bar_full, bar_empty);
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
    if constexpr ((OPT & kOptOneScorer) != 0) {
      static_assert((OPT & (kOptEarlyS | kOptWideFp8)) == 0, "kOptOneScorer: no early-scores / wide-FP8 form (spills)");
      consumer_p1<(OPT & kOptLazy) != 0>(smem, q, sink, out, lse, part_o, part_lse, p, items, tid, bar_full, bar_empty);
    } else {
      consumer_p<OPT>(smem, q, sink, out, lse, part_o, part_lse, p, items, tid, bar_full, bar_empty);
    }
  }
}

// max_ctas > 0 caps the grid (tests: several items per CTA at small sizes); 0: one CTA per SM of the current device.
template <bool FP8, int OPT = 0>
static int launch_persist(const LaunchArgs& a, int max_ctas, cudaStream_t stream) {
  const int smem = Smem::total + 1024;  // + alignment slack
  auto kern = ws3p_decode_kernel<FP8, OPT>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return (int)e;
  const Params& p = a.p;
  const int64_t items = (int64_t)a.num_tokens * p.num_splits * (p.H / kH);
  if (items <= 0) return 0;
  int ctas = max_ctas;
  if (ctas <= 0) {
    int dev = 0;
    e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return (int)e;
  }
  const int64_t grid = items < (int64_t)ctas ? items : (int64_t)ctas;
  return launch_kernel(kern, grid, Cfg<FP8>::kThreads, smem, stream, a, items);
}

// The instantiated option sets: BF16 2, 4, 6, 8, 10 (kOptWideFp8 is FP8-only: cleared here for BF16); FP8 1, 2, 4, 7,
// 8, 10 (not 9 / 11 / 12 / 14: kOptOneScorer's consumers spill with kOptWideFp8's 192 registers, and with kOptEarlyS
// (32 score registers live next to O during P @ V)); 0 is ws3p itself.
template <bool FP8>
static int launch_persist_opt(const LaunchArgs& a, int max_ctas, int opt, cudaStream_t s) {
  if constexpr (FP8) {
    switch (opt) {
      case 0: return launch_persist<true, 0>(a, max_ctas, s);
      case 1: return launch_persist<true, 1>(a, max_ctas, s);
      case 2: return launch_persist<true, 2>(a, max_ctas, s);
      case 4: return launch_persist<true, 4>(a, max_ctas, s);
      case 7: return launch_persist<true, 7>(a, max_ctas, s);
      case 8: return launch_persist<true, 8>(a, max_ctas, s);
      case 10: return launch_persist<true, 10>(a, max_ctas, s);
      default: return (int)cudaErrorInvalidValue;
    }
  } else {
    switch (opt & ~kOptWideFp8) {
      case 0: return launch_persist<false, 0>(a, max_ctas, s);
      case 2: return launch_persist<false, 2>(a, max_ctas, s);
      case 4: return launch_persist<false, 4>(a, max_ctas, s);
      case 6: return launch_persist<false, 6>(a, max_ctas, s);
      case 8: return launch_persist<false, 8>(a, max_ctas, s);
      case 10: return launch_persist<false, 10>(a, max_ctas, s);
      default: return (int)cudaErrorInvalidValue;
    }
  }
}

#ifdef FM_WS3_VEC_TU
// fm_ws3v_decode.cu (this file included with FM_WS3_VEC_TU): the kOptVec builds only, so that this file's own
// instances (and the compile test counting them) stay as they were. FP8 only (BF16 has no dequant: the Python side
// runs the same opt without kOptVec through fm_ws3p_launch_opt).
static int launch_persist_vec(const LaunchArgs& a, int max_ctas, int opt, cudaStream_t s) {
  switch (opt) {
    case 24: return launch_persist<true, 24>(a, max_ctas, s);
    default: return (int)cudaErrorInvalidValue;
  }
}
#else
// kOptOverlap + kOptOvlAdapt builds (session 10; fm_ws3p_launch_ovl): BF16 106 (ws3p1l + both), FP8 120 (ws3p1v +
// both); FP8 632 (+ kOptVecWide, session 11); BF16 1130 / FP8 1658 (+ kOptThresh, session 14).
template <bool FP8>
static int launch_persist_ovl(const LaunchArgs& a, int max_ctas, int opt, cudaStream_t s) {
  if constexpr (FP8) {
    switch (opt) {
      case 120: return launch_persist<true, 120>(a, max_ctas, s);
      case 632: return launch_persist<true, 632>(a, max_ctas, s);  // + kOptVecWide (session 11)
      case 1658: return launch_persist<true, 1658>(a, max_ctas, s);  // + kOptLazy + kOptThresh (session 14)
      default: return (int)cudaErrorInvalidValue;
    }
  } else {
    switch (opt) {
      case 106: return launch_persist<false, 106>(a, max_ctas, s);
      case 1130: return launch_persist<false, 1130>(a, max_ctas, s);  // + kOptThresh (session 14)
      default: return (int)cudaErrorInvalidValue;
    }
  }
}
#endif
}  // namespace fm_ws3

#ifndef FM_WS3_VEC_TU
int fm_ws3p_launch_ovl(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, int opt, uintptr_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  return fp8 ? fm_ws3::launch_persist_ovl<true>(a, max_ctas, opt, s)
             : fm_ws3::launch_persist_ovl<false>(a, max_ctas, opt, s);
}

int fm_ws3p_launch_opt(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, int opt, uintptr_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  return fp8 ? fm_ws3::launch_persist_opt<true>(a, max_ctas, opt, s)
             : fm_ws3::launch_persist_opt<false>(a, max_ctas, opt, s);
}

int fm_ws3_launch(const fm_ws::LaunchArgs& a, bool fp8, int mode, uintptr_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  return fp8 ? fm_ws3::launch_mode<true>(a, mode, s) : fm_ws3::launch_mode<false>(a, mode, s);
}

int fm_ws3_launch_extra(const fm_ws::LaunchArgs& a, const fm_ws3::Extra& e, bool fp8, uintptr_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const fm_ws3::XParams x{reinterpret_cast<const uint8_t*>(e.kv2), reinterpret_cast<const int*>(e.idx2), e.topk2,
                          e.n_rows2, e.stride_it2, e.stride_kv2};
  return fp8 ? fm_ws3::launch_impl<true, fm_ws3::kFull, true>(a, s, x)
             : fm_ws3::launch_impl<false, fm_ws3::kFull, true>(a, s, x);
}

int fm_ws3_smem_bytes_extra() { return fm_ws3::Smem::total_extra + 1024; }

int fm_ws3_smem_bytes(bool fp8) {
  (void)fp8;  // same layout for both caches: FP8 rows are dequantised by the producers straight into the ring
  return fm_ws3::Smem::total + 1024;
}

int fm_ws3_block_rows() { return fm_ws3::kBN; }

int fm_ws3_threads(bool fp8) { return fp8 ? fm_ws3::Cfg<true>::kThreads : fm_ws3::Cfg<false>::kThreads; }

int fm_ws3p_launch(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, uintptr_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  return fp8 ? fm_ws3::launch_persist<true>(a, max_ctas, s) : fm_ws3::launch_persist<false>(a, max_ctas, s);
}
#endif  // FM_WS3_VEC_TU
