// W4A16 M-grouped GEMM, "kernel 5": a persistent variant of kernel 4 (dg_fp4_grouped.cuh; same operands, same
// swap-AB mma.sync scheme, same dequantisation and k permutation, which it reuses) aimed at the instruction issue
// rate, which bounds kernel 4 (session 4: 2.3 TB/s at 8 tokens per expert; `cuobjdump -sass` of m8n64k256w4s4cu:
// ~555 warp instructions per 2 KB of weights per warp and stage = 0.27 per byte, of which the dequantisation is
// ~330, the cp.async loader ~90, the activation pairing ~40, barriers / branches / addresses the rest; at 2.3 TB/s
// that is already ~60 % of the H200's issue slots). Differences from kernel 4, each aimed at that count:
//   * KT = 256 or 512 k per pipeline stage: 512 halves the per-stage fixed cost (barrier, wait, loop, addresses)
//     and doubles the contiguous bytes per weight row and stage (256 B);
//   * a leaner loader: no per-item 64-bit pointer selects. Rows past n and tokens past the expert's end are not
//     copied at all (their shared bytes are stale: they only feed MMA rows / columns whose outputs are never
//     stored); the k tail (k % KT) is zero-filled from a valid address (the row's start);
//   * with RT = 2 row tiles per warp the activation fragments are loaded and paired once per token group, not once
//     per row tile;
//   * a dequantisation with one multiply per two weights instead of a shift and an IMAD.HI (whose zero addend
//     half costs a register move: p_e2m1x2_bits), same bits;
//   * one warp-uniform test per stage for scale bytes > 128 (the second multiply of dequant32) instead of a
//     divergent branch per 32-weight chunk;
//   * two accumulator chains per (row tile, token group) (even / odd MMA of a 128-k sub-tile): half the dependent
//     mma.sync chain;
//   * a persistent grid (CTAs per SM x SMs, from the occupancy API) over (active expert, n slab) work items: every
//     CTA copies `offs` to shared memory and compacts the non-empty experts (warp ballots), so empty experts cost
//     no CTA launch (decode at batch 4 activates 24 of 256 experts). Work items are expert-major, so the CTAs that
//     run at the same time share an expert's activations in L2. Still no host read of offs (CUDA-graph safe).
// Hot-loop warp instructions per 2 KB of weights per warp (sm_90a SASS, nvcc 13.0): kernel 4 m8n64k256w4s4cu 556;
// here m8n64k256w4s4cp 423, m8n64k512w4s2cp 401, m8n128k256w4s3cp 377. Tried and dropped: one cp.async pipeline
// through all of a CTA's work items (no per-item fill / drain): at the 128-register cap of the 4-CTA variants the
// extra loop state made ptxas recompute the lanes' shared-memory offsets every stage (474 per 2 KB). Session 6's
// "kernel 6" (the same tiles in one cp.async pipeline per CTA across (token block, slab) work items) lost to
// kernel 5 everywhere (3-25 % slower) and was removed in session 9.
#pragma once

#include "dg_fp4_grouped.cuh"

namespace dg_fp4 {

template <int KT, int TN, int WARPS, int RT, int NS>
struct PCfg {
  static_assert(KT == 256 || KT == 512, "KT: 256 or 512 k per stage");
  static_assert(TN % 8 == 0 && TN >= 8 && TN <= 64, "TN: 8..64, a multiple of 8");
  static_assert(RT == 1 || RT == 2, "RT: 1 or 2 row tiles of 16 per warp");
  static_assert(NS >= 2 && NS <= 6, "NS: 2..6 stages");
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kRows = WARPS * RT * 16;
  static constexpr int kWRow = KT / 2;       // packed weight bytes of one row per stage
  static constexpr int kSRow = KT / 32;      // scale bytes of one row per stage (one per 16-byte chunk)
  static constexpr int kARow = KT * 2 + 16;  // bf16 activation row per stage, padded 16 B (bank spread)
  static constexpr int kWChunks = KT / 32, kSWords = KT / 128, kAChunks = KT / 8;  // copy items per row
  static constexpr int kWBytes = kRows * kWRow;
  static constexpr int kSBytes = kRows * kSRow;
  static constexpr int kABytes = TN * kARow;
  static constexpr int kStageBytes = kWBytes + kSBytes + kABytes;
  static constexpr int kSmemBytes = NS * kStageBytes;  // + the offs copy and the active-expert list (launcher)
  static constexpr int kWStep = kThreads / kWChunks, kSStep = kThreads / kSWords, kAStep = kThreads / kAChunks;
  static constexpr int kWItems = kRows / kWStep, kSItems = kRows / kSStep, kAItems = TN / kAStep;
  // Register cap from the CTAs the shared memory admits (H200: 228 KB per SM, 1 KB reserved per CTA), but never
  // below 128 registers per thread (4-warp CTAs: at most 4 CTAs per SM from registers).
  static constexpr int kFit = 233472 / (kSmemBytes + 1024 + 2048);
  static constexpr int kRegBlocks = 65536 / (kThreads * 128);
  static constexpr int kMinBlocks = kFit < 1 ? 1 : (kFit < kRegBlocks ? kFit : kRegBlocks);
  static_assert(kThreads % kWChunks == 0 && kThreads % kSWords == 0 && kThreads % kAChunks == 0, "copy split");
  static_assert(kWStep % 2 == 0, "weight items must keep their row's parity (swizzle)");
  static_assert(kRows % kWStep == 0 && kRows % kSStep == 0 && TN % kAStep == 0, "copy items per thread");
  static_assert(kWItems <= 32 && kSItems <= 32 && kAItems <= 32, "validity masks are 32-bit");
  static_assert(kStageBytes % 16 == 0, "stages must stay 16-byte aligned");
};

// One thread's copies per stage, fixed for a (work item, token block): item i of a kind is base + i * stride
// (+ the k tile's offset) and lands at dst + i * (step rows of shared memory). ok bit i: item i has a valid row /
// token (invalid items are not copied).
struct PPlan {
  const uint8_t* w;
  const uint8_t* s;
  const uint8_t* a;
  uint32_t w_stride, s_stride, a_stride;
  uint32_t w_ok, s_ok, a_ok;
  int w_kfirst, s_kfirst, a_kfirst;
  uint32_t w_dst, s_dst, a_dst;
};

__device__ __forceinline__ uint32_t valid_mask(int first, int step, int items, int limit) {
  uint32_t m = 0;
  for (int i = 0; i < items; ++i) m |= static_cast<uint32_t>(first + i * step < limit) << i;
  return m;
}

template <int KT, int TN, int WARPS, int RT, int NS>
__device__ __forceinline__ PPlan p_make_plan(const Fp4Args& p, int e, int row0, int tok0, int end) {
  using C = PCfg<KT, TN, WARPS, RT, NS>;
  const int tid = threadIdx.x;
  const int wr = tid / C::kWChunks, wc = tid % C::kWChunks;
  const int sr = tid / C::kSWords, sh = tid % C::kSWords;
  const int at = tid / C::kAChunks, ac = tid % C::kAChunks;
  const size_t wrow = static_cast<size_t>(p.k / 2), srow = static_cast<size_t>(p.k / 32);
  const size_t erow = static_cast<size_t>(e) * p.n + row0;
  PPlan l;
  l.w_ok = valid_mask(wr, C::kWStep, C::kWItems, p.n - row0);
  l.s_ok = valid_mask(sr, C::kSStep, C::kSItems, p.n - row0);
  l.a_ok = valid_mask(at, C::kAStep, C::kAItems, end - tok0);
  // item 0's address is only formed from a valid row / token (else the tensor's start: nothing is copied then)
  l.w = (l.w_ok & 1u) ? p.packed + (erow + wr) * wrow + wc * 16 : p.packed;
  l.s = (l.s_ok & 1u) ? p.scales + (erow + sr) * srow + sh * 4 : p.scales;
  l.a = (l.a_ok & 1u) ? reinterpret_cast<const uint8_t*>(p.a + static_cast<size_t>(tok0 + at) * p.k + ac * 8)
                      : reinterpret_cast<const uint8_t*>(p.a);
  l.w_stride = static_cast<uint32_t>(C::kWStep * wrow);
  l.s_stride = static_cast<uint32_t>(C::kSStep * srow);
  l.a_stride = static_cast<uint32_t>(C::kAStep * p.k * 2);
  l.w_kfirst = wc * 32;
  l.s_kfirst = sh * 128;
  l.a_kfirst = ac * 8;
  l.w_dst = wr * C::kWRow + ((wc ^ ((wr & 1) << 2)) << 4);
  l.s_dst = sr * C::kSRow + sh * 4;
  l.a_dst = at * C::kARow + (a_swizzle(ac) << 4);
  return l;
}

// The k tail (kbase + kfirst >= k) zero-fills from the row's start (a valid address), valid rows only.
template <int KT, int TN, int WARPS, int RT, int NS>
__device__ __forceinline__ void p_load_stage(const PPlan& l, int k, uint32_t stage, int kt) {
  using C = PCfg<KT, TN, WARPS, RT, NS>;
  const int kbase = kt * KT;
  const uint32_t sw = stage, ss = stage + C::kWBytes, sa = stage + C::kWBytes + C::kSBytes;
  const bool wk = kbase + l.w_kfirst < k, sk = kbase + l.s_kfirst < k, ak = kbase + l.a_kfirst < k;
  const uint8_t* w = l.w + (wk ? kbase / 2 : 0);
  const uint8_t* s = l.s + (sk ? kbase / 32 : 0);
  const uint8_t* a = l.a + (ak ? kbase * 2 : 0);
#pragma unroll
  for (int i = 0; i < C::kWItems; ++i) {
    if ((l.w_ok >> i) & 1u) cp_async16(sw + l.w_dst + i * C::kWStep * C::kWRow, w + i * l.w_stride, wk);
  }
#pragma unroll
  for (int i = 0; i < C::kSItems; ++i) {
    if ((l.s_ok >> i) & 1u) cp_async4(ss + l.s_dst + i * C::kSStep * C::kSRow, s + i * l.s_stride, sk);
  }
#pragma unroll
  for (int i = 0; i < C::kAItems; ++i) {
    if ((l.a_ok >> i) & 1u) cp_async16(sa + l.a_dst + i * C::kAStep * C::kARow, a + i * l.a_stride, ak);
  }
}

// Dequantisation with one multiply and no zero-register pair. Kernel 4's (v + (v >> 6)) is an IMAD.HI whose 64-bit
// addend {0, v} costs a register move of zero per call (~32 IMAD.MOV per 2 KB of weights in its SASS). Here the
// nibble pair of register R (codes R and R+4, same pairing as e2m1x2_bits) is masked where it sits (bits 4R'..4R'+3
// of each 16-bit lane, R' = R % 2, after a byte shift of the word for R >= 2), then ONE low multiply writes both
// copies that the same final mask keeps: x * 2^(6-4R') puts the magnitude bits at 8..6, x * 2^(12-4R') the sign at
// 15 (the copies share no bit, so no carries: x * 65 * 2^(6-4R')). Same bits as e2m1x2_bits for every word (checked
// exhaustively per nibble pair). The multipliers (4160, 260) come from the kernel arguments (PMul::from): with
// literals ptxas rewrites the multiply into two integer-ALU shifts.
struct PMul {
  uint32_t m4160, m260;  // 65 * 2^6, 65 * 2^2
  __device__ __forceinline__ static PMul from(uint32_t shr6_mul) {  // shr6_mul = 2^26 (Fp4Args)
    return PMul{(shr6_mul >> 20) * 65u, (shr6_mul >> 24) * 65u};
  }
};

template <int R>
__device__ __forceinline__ uint32_t p_e2m1x2_bits(uint32_t q, uint32_t q8, const PMul& mul) {
  const uint32_t src = R < 2 ? q : q8;
  const uint32_t mask = (R & 1) ? 0x00F000F0u : 0x000F000Fu;
  return ((src & mask) * ((R & 1) ? mul.m260 : mul.m4160)) & 0x81C081C0u;
}

// dequant32 without the scale-byte > 128 branch (p_compute_stage takes this path when no lane of the warp has such
// a byte in the stage: real checkpoints never do); with kBig the second multiply of dequant32 for bytes > 128.
template <bool kBig>
__device__ __forceinline__ void p_dequant32(const uint4 w, uint32_t s, const PMul& mul, uint32_t (&out)[16]) {
  const bool big = kBig && s > 128u;
  const uint32_t m1 = big ? 0x7F007F00u : ((s + 126u) << 7) * 0x10001u;  // 2^(s-1) (s <= 128), else 2^127
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t q = words[i], q8 = q >> 8;
    out[4 * i + 0] = mul_bf16x2(p_e2m1x2_bits<0>(q, q8, mul), m1);
    out[4 * i + 1] = mul_bf16x2(p_e2m1x2_bits<1>(q, q8, mul), m1);
    out[4 * i + 2] = mul_bf16x2(p_e2m1x2_bits<2>(q, q8, mul), m1);
    out[4 * i + 3] = mul_bf16x2(p_e2m1x2_bits<3>(q, q8, mul), m1);
  }
  if (big) {
    const uint32_t m2 = ((s - 1u) << 7) * 0x10001u;  // 2^(s-128)
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = mul_bf16x2(out[i], m2);
  }
}

// acc[rt][tg][c]: chain c = 0 takes the even MMAs of a 128-k sub-tile, c = 1 the odd ones. sc[kk][rt][h]: this
// lane's scale bytes (h = 0: row g, 1: row g + 8).
template <int KT, int TN, int WARPS, int RT, int NS, bool kBig>
__device__ __forceinline__ void p_compute_impl(uint32_t stage, const PMul& mul, const uint32_t (&sc)[KT / 128][RT][2],
                                               float (&acc)[RT][TN / 8][2][4]) {
  using C = PCfg<KT, TN, WARPS, RT, NS>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const uint32_t sw = stage, sa = stage + C::kWBytes + C::kSBytes;
#pragma unroll
  for (int kk = 0; kk < KT / 128; ++kk) {
    const int cidx = kk * 4 + tq;  // this lane's 16-byte chunk (scale group) of the stage's weight row
    uint32_t lo[RT][16], hi[RT][16];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const int rlo = (warp * RT + rt) * 16 + gq, rhi = rlo + 8;  // same parity: same swizzle
      const int woff = (cidx ^ ((rlo & 1) << 2)) << 4;
      p_dequant32<kBig>(lds128(sw + rlo * C::kWRow + woff), sc[kk][rt][0], mul, lo[rt]);
      p_dequant32<kBig>(lds128(sw + rhi * C::kWRow + woff), sc[kk][rt][1], mul, hi[rt]);
    }
#pragma unroll
    for (int tg = 0; tg < TN / 8; ++tg) {
      const uint32_t arow = sa + (tg * 8 + gq) * C::kARow;
      uint32_t b[16];
#pragma unroll
      for (int q = 0; q < 4; ++q) act_pairs(lds128(arow + (a_swizzle(kk * 16 + tq * 4 + q) << 4)), &b[4 * q]);
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          mma_bf16_16816(acc[rt][tg][j & 1], lo[rt][2 * j], hi[rt][2 * j], lo[rt][2 * j + 1], hi[rt][2 * j + 1],
                         b[2 * j], b[2 * j + 1]);
        }
      }
    }
  }
}

// One stage: the lane's scale bytes first, then one warp-uniform choice of the dequantiser (no per-chunk branch).
template <int KT, int TN, int WARPS, int RT, int NS>
__device__ __forceinline__ void p_compute_stage(uint32_t stage, const PMul& mul, float (&acc)[RT][TN / 8][2][4]) {
  using C = PCfg<KT, TN, WARPS, RT, NS>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const uint32_t ss = stage + C::kWBytes;
  uint32_t sc[KT / 128][RT][2];
  bool big = false;
#pragma unroll
  for (int kk = 0; kk < KT / 128; ++kk) {
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const int rlo = (warp * RT + rt) * 16 + gq;
      sc[kk][rt][0] = lds8(ss + rlo * C::kSRow + kk * 4 + tq);
      sc[kk][rt][1] = lds8(ss + (rlo + 8) * C::kSRow + kk * 4 + tq);
      big = big || sc[kk][rt][0] > 128u || sc[kk][rt][1] > 128u;
    }
  }
  if (__any_sync(0xffffffffu, big)) {
    p_compute_impl<KT, TN, WARPS, RT, NS, true>(stage, mul, sc, acc);
  } else {
    p_compute_impl<KT, TN, WARPS, RT, NS, false>(stage, mul, sc, acc);
  }
}

// One work item's token block: stream the (expert e, rows row0..) slab through the pipeline for tokens
// [tok0, min(tok0 + TN, end)) and store their outputs. Leaves every stage free (drained and synced).
template <int KT, int TN, int WARPS, int RT, int NS>
__device__ __forceinline__ void p_token_block(const Fp4Args& p, const PMul& mul, uint32_t base, int e, int row0,
                                              int tok0, int end) {
  using C = PCfg<KT, TN, WARPS, RT, NS>;
  const int ktiles = (p.k + KT - 1) / KT;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  float acc[RT][TN / 8][2][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int tg = 0; tg < TN / 8; ++tg)
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[rt][tg][c][i] = 0.f;

  const PPlan plan = p_make_plan<KT, TN, WARPS, RT, NS>(p, e, row0, tok0, end);
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) {
    if (s < ktiles) p_load_stage<KT, TN, WARPS, RT, NS>(plan, p.k, base + s * C::kStageBytes, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<NS - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt-1 is free for the next load
    const int next = kt + NS - 1;
    if (next < ktiles) p_load_stage<KT, TN, WARPS, RT, NS>(plan, p.k, base + (next % NS) * C::kStageBytes, next);
    cp_async_commit();
    p_compute_stage<KT, TN, WARPS, RT, NS>(base + (kt % NS) * C::kStageBytes, mul, acc);
  }
  cp_async_wait<0>();
  __syncthreads();  // every stage is free before the next token block / work item refills them

#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const int r = row0 + (warp * RT + rt) * 16 + gq;
#pragma unroll
    for (int tg = 0; tg < TN / 8; ++tg) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = tok0 + tg * 8 + 2 * tq + (i & 1);
        const int row = r + (i >> 1) * 8;
        if (tok < end && row < p.n) {
          p.out[static_cast<size_t>(tok) * p.n + row] = __float2bfloat16_rn(acc[rt][tg][0][i] + acc[rt][tg][1][i]);
        }
      }
    }
  }
}

// Shared memory past the pipeline stages: offs copy [g], active experts [g], their count (launcher: p_extra_bytes).
__host__ __device__ constexpr int p_extra_bytes(int g) { return (2 * g + 4) * 4; }

template <int KT, int TN, int WARPS, int RT, int NS>
__global__ void __launch_bounds__(WARPS * 32, (PCfg<KT, TN, WARPS, RT, NS>::kMinBlocks))
    fp4_w4a16_persistent_kernel(const Fp4Args p) {
  using C = PCfg<KT, TN, WARPS, RT, NS>;
  DG_FP4_DYNAMIC_SMEM(smem);
  int* so = reinterpret_cast<int*>(smem + C::kSmemBytes);  // offs copy
  int* list = so + p.g;                                    // active experts, in order; list[g] = their count
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < p.g; e += C::kThreads) so[e] = p.offs[e];
  __syncthreads();
  if (warp == 0) {  // ordered compaction of the non-empty experts, 32 per ballot
    int count = 0;
    for (int e0 = 0; e0 < p.g; e0 += 32) {
      const int e = e0 + lane;
      bool act = false;
      if (e < p.g) act = (e > 0 ? max(so[e - 1], 0) : 0) < min(so[e], p.m);
      const uint32_t mask = __ballot_sync(0xffffffffu, act);
      if (act) list[count + __popc(mask & ((1u << lane) - 1u))] = e;
      count += __popc(mask);
    }
    if (lane == 0) list[p.g] = count;
  }
  __syncthreads();
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const PMul mul = PMul::from(p.shr6_mul);
  const int slabs = (p.n + C::kRows - 1) / C::kRows;
  const int items = list[p.g] * slabs;
  for (int w = blockIdx.x; w < items; w += gridDim.x) {
    const int idx = w / slabs;
    const int e = list[idx], row0 = (w - idx * slabs) * C::kRows;
    const int start = e > 0 ? max(so[e - 1], 0) : 0, end = min(so[e], p.m);
    for (int tok0 = start; tok0 < end; tok0 += TN) {
      p_token_block<KT, TN, WARPS, RT, NS>(p, mul, base, e, row0, tok0, end);
    }
  }
}

}  // namespace dg_fp4
