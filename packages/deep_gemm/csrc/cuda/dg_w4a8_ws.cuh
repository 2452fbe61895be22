// Warp-specialised W4A8 M-grouped GEMM (sm_90a), scheme "ws": same operands, tiles, schedule and numerics as the
// absolute-scale path of w4a8_grouped_kernel (dg_w4a8_grouped.cuh; bit-equal to cuda_wg2s4), but split by role:
//
//   warpgroup 0 (producer): cp.async of the A tile, packed weights and E8M0 bytes of k-block lp into ring stage
//     lp % S (after the consumers released it: empty mbarrier), and D = S - 2 blocks behind, the FP4 -> e4m3
//     conversion of block lp - D into that stage's own e4m3 B tile + promotion factors + mode (fast / slow), then a
//     full-mbarrier arrive. The slow flag is a producer-only named-barrier reduction (bar.red.or), so the consumers
//     never join a CTA barrier.
//   warpgroups 1, 2 (consumers): wait full[stage], four m64n128k32 wgmmas into tmp, promote once per block (or the
//     exact per-32 path), arrive empty[stage]; epilogue stores bf16 rows. The two consumers are independent, so one's
//     promotion overlaps the other's wgmmas.
//
// kPipe = false uses no setmaxnreg: at 384 threads the ceiling is 168 registers and a consumer needs ~140 (acc 64 +
// tmp 64). kPipe = true (ws_consumer_pipe) keeps two blocks' wgmmas in flight per consumer (tmp x 2) and moves
// registers from the producer (56) to the consumers (224) with setmaxnreg.
#pragma once
#include "dg_w4a8_grouped.cuh"

namespace dg_w4a8 {

template <int kStages>
struct WsLayout {
  static constexpr int kBM = 128;                  // two consumer warpgroups x m64
  static constexpr int kThreads = 384;             // producer + 2 consumers
  static constexpr int kA = kBM * kBK;             // e4m3 A tile [128, 128] (128-byte swizzle), stage offset 0
  static constexpr int kB = kA;                    // e4m3 B tile [128, 128] (128-byte swizzle), offset 16 KiB
  static constexpr int kW = kB + kBN * kBK;        // packed weights [128, 64]
  static constexpr int kS = kW + kBN * kBK / 2;    // E8M0 bytes [128, 4]
  static constexpr int kF = kS + kBN * 4;          // float [4][128] promotion factors
  static constexpr int kMode = kF + 4 * kBN * 4;   // int: block mode (kAbsFast / kAbsSlow)
  static constexpr int kStage = (kMode + 16 + 1023) / 1024 * 1024;
  static constexpr int kLut = kStages * kStage;    // uint8 [16][8]
  static constexpr int kBar = kLut + 128;          // uint64 full[S], empty[S]
  static constexpr int kScan = kBar + 16 * kStages;
  static constexpr int kPrefix = kScan + 64;       // int [g + 1]
  static constexpr int bytes(int g) { return kPrefix + 4 * (g + 1) + 1024; }
};

// ------------------------------------------------------------------------------------------------ mbarrier / bar

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}
// Watchdog: 2^30 failed polls (>= ~10 s even if a poll took only 20 cycles; a whole GEMM takes milliseconds) mean a
// protocol bug: trap (a launch error) rather than hang the device. A counter, not clock64: no extra registers.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t polls = 0;
  while (!mbar_try_wait(bar, parity)) {
    if (++polls == (1u << 30)) __trap();
  }
}

// Named barrier of the producer warpgroup only (id 1, 128 threads); the _or form returns the OR of `v` over them.
__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }
__device__ __forceinline__ int producer_or(int v) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.b32 p, %1, 0;\nbar.red.or.pred q, 1, 128, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(v)
      : "memory");
  return (int)r;
}

// ------------------------------------------------------------------------------------------------ producer

// Stage `stage` <- k-block kb of `tile` (cp.async; producer thread ptid of 128). Rows past the group end / past n
// read as zeros, as load_block.
template <int kStages>
__device__ __forceinline__ void ws_load(const Params& p, uint8_t* st, const Tile& tile, int kb, int ptid) {
  using L = WsLayout<kStages>;
  const uint32_t a_dst = smem_u32(st), w_dst = smem_u32(st + L::kW), s_dst = smem_u32(st + L::kS);
#pragma unroll
  for (int idx = ptid; idx < L::kBM * 8; idx += 128) {
    const int r = idx >> 3, c = idx & 7, row = tile.row0 + r;
    const bool ok = row < tile.rend;
    const uint8_t* src = p.a + (size_t)(ok ? row : 0) * p.k + kb * kBK + c * 16;
    cp_async16(a_dst + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
  }
  const size_t wrow0 = (size_t)tile.grp * p.n;
#pragma unroll
  for (int idx = ptid; idx < kBN * 4; idx += 128) {
    const int r = idx >> 2, c = idx & 3, nr = tile.n0 + r;
    const bool ok = nr < p.n;
    const uint8_t* src = p.packed + (wrow0 + (ok ? nr : 0)) * (size_t)(p.k / 2) + kb * (kBK / 2) + c * 16;
    cp_async16(w_dst + r * 64 + c * 16, src, ok);
  }
  {
    const int r = ptid, nr = tile.n0 + r;  // kBN == 128 producer threads: one row each
    const bool ok = nr < p.n;
    const uint8_t* src = p.scales + (wrow0 + (ok ? nr : 0)) * (size_t)(p.k / 32) + kb * 4;
    cp_async4(s_dst + r * 4, src, ok);
  }
}

// Stage `st`: packed weights + scale bytes -> its e4m3 B tile, factors and mode; the same arithmetic as
// convert_block's absolute scheme (one weight row per producer thread, both halves).
template <int kStages>
__device__ __forceinline__ void ws_convert(uint8_t* st, const uint32_t* lut, int ptid) {
  using L = WsLayout<kStages>;
  const uint8_t* w_src = st + L::kW;
  const uint32_t* s_src = reinterpret_cast<const uint32_t*>(st + L::kS);
  const int r = ptid;
  const uint32_t sc = s_src[r];
  const uint32_t smax = max4(sc);
  const bool slow = producer_or((smax - min4(sc)) > (uint32_t)kMaxShift) != 0;
  uint8_t* b = st + L::kB;
  float* sw = reinterpret_cast<float*>(st + L::kF);
#pragma unroll
  for (int grp = 0; grp < 4; ++grp) {  // 32 codes = elements 32 grp .. 32 grp + 31
    const uint4 q = *reinterpret_cast<const uint4*>(w_src + r * 64 + grp * 16);
    const uint32_t s = (sc >> (8 * grp)) & 0xffu;
    const uint32_t d = slow ? 0u : smax - s;
    const uint32_t lo = lut[2 * d], hi = lut[2 * d + 1];
    const uint2 e0 = codes_to_e4m3(q.x, lo, hi), e1 = codes_to_e4m3(q.y, lo, hi);
    const uint2 e2 = codes_to_e4m3(q.z, lo, hi), e3 = codes_to_e4m3(q.w, lo, hi);
    const int c0 = 2 * grp;
    *reinterpret_cast<uint4*>(b + r * 128 + ((c0 ^ (r & 7)) << 4)) = make_uint4(e0.x, e0.y, e1.x, e1.y);
    *reinterpret_cast<uint4*>(b + r * 128 + (((c0 + 1) ^ (r & 7)) << 4)) = make_uint4(e2.x, e2.y, e3.x, e3.y);
  }
  if (slow) {
#pragma unroll
    for (int j = 0; j < 4; ++j) sw[j * kBN + r] = pow2_scale((sc >> (8 * j)) & 0xffu);
  } else {
    sw[r] = pow2_scale(smax);
  }
  if (ptid == 0) *reinterpret_cast<int*>(st + L::kMode) = slow ? kAbsSlow : kAbsFast;
}

template <int kStages>
__device__ void ws_producer(const Params& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                            int n_tiles) {
  using L = WsLayout<kStages>;
  constexpr int kD = kStages - 2;  // blocks in flight between load and conversion
  const int ptid = threadIdx.x;    // 0..127
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kStages;
  const uint32_t* lut = reinterpret_cast<const uint32_t*>(smem + L::kLut);
  const int steps = my_tiles * kblocks;
  int lt = 0, lkb = 0;
  Tile ltile = decode_tile<L::kBM>(blockIdx.x, prefix, p.offs, p.g, p.m, n_tiles);
  for (int lp = 0; lp < steps + kD; ++lp) {
    if (lp < steps) {
      const int s = lp % kStages;
      if (lp >= kStages) mbar_wait(&empty[s], (uint32_t)((lp / kStages - 1) & 1));
      ws_load<kStages>(p, smem + s * L::kStage, ltile, lkb, ptid);
      if (++lkb == kblocks) {
        lkb = 0;
        ++lt;
        if (lt < my_tiles) ltile = decode_tile<L::kBM>(blockIdx.x + lt * gridDim.x, prefix, p.offs, p.g, p.m, n_tiles);
      }
    }
    cp_commit();  // always: keeps the group count uniform for cp_wait
    const int cv = lp - kD;
    if (cv >= 0) {
      cp_wait<kD>();  // this thread's copies of block cv have landed
      producer_sync();  // ... and every producer thread's (the conversion reads other threads' bytes)
      uint8_t* st = smem + (cv % kStages) * L::kStage;
      ws_convert<kStages>(st, lut, ptid);
      fence_async_smem();  // generic-proxy writes (cp.async A tile, converted B tile) -> visible to wgmma
      mbar_arrive(&full[cv % kStages]);
    }
  }
  cp_wait<0>();
}

// ------------------------------------------------------------------------------------------------ consumers

template <int kStages>
__device__ void ws_consumer(const Params& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                            int n_tiles) {
  using L = WsLayout<kStages>;
  const int tid = threadIdx.x - 128, lane = tid & 31, cw = tid >> 7;  // consumer warpgroup 0 / 1
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kStages;
  const int steps = my_tiles * kblocks, ks = p.k / kBK;
  float acc[64], tmp[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  int ct = 0, ckb = 0;
  Tile ctile = decode_tile<L::kBM>(blockIdx.x, prefix, p.offs, p.g, p.m, n_tiles);
  const int r_off = 64 * cw + 16 * ((tid >> 5) & 3) + (lane >> 2);
  for (int sp = 0; sp < steps; ++sp) {
    const int stage = sp % kStages;
    uint8_t* st = smem + stage * L::kStage;
    const int r0 = ctile.row0 + r_off;
    const float sa0 = __ldg(p.sfa + (size_t)(r0 < ctile.rend ? r0 : 0) * ks + ckb);  // before the wait: hides latency
    const float sa1 = __ldg(p.sfa + (size_t)(r0 + 8 < ctile.rend ? r0 + 8 : 0) * ks + ckb);
    mbar_wait(&full[stage], (uint32_t)((sp / kStages) & 1));
    const uint32_t a_base = smem_u32(st) + cw * 64 * 128;
    const uint32_t b_base = smem_u32(st + L::kB);
    const float* colf = reinterpret_cast<const float*>(st + L::kF);
    const bool slow = *reinterpret_cast<const volatile int*>(st + L::kMode) == kAbsSlow;
    if (!slow) {
      wg_arrive();
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_m64n128k32_e4m3(tmp, gmma_desc(a_base + 32 * j), gmma_desc(b_base + 32 * j), j);
      wg_commit();
      wg_wait0();
      reg_fence<64>(tmp);
      promote(acc, tmp, colf, sa0, sa1);
    } else {  // adversarial scales: four k32 steps, each promoted with its own group scale
#pragma unroll 1
      for (int j = 0; j < 4; ++j) {
        wg_arrive();
        wgmma_m64n128k32_e4m3(tmp, gmma_desc(a_base + 32 * j), gmma_desc(b_base + 32 * j), 0);
        wg_commit();
        wg_wait0();
        reg_fence<64>(tmp);
        promote(acc, tmp, colf + j * kBN, sa0, sa1);
      }
    }
    mbar_arrive(&empty[stage]);  // the wgmmas and the factor reads of this stage are done
    if (++ckb == kblocks) {
      store_tile(p, ctile, acc, r0);
      ckb = 0;
      ++ct;
      if (ct < my_tiles) ctile = decode_tile<L::kBM>(blockIdx.x + ct * gridDim.x, prefix, p.offs, p.g, p.m, n_tiles);
    }
  }
}


// ------------------------------------------------------------------------------------------------ pipelined consumers

// kPipe consumers: block sp + 1's wgmmas are issued before block sp is promoted (two tmp register sets, ~200
// registers: the kernel moves registers from the producer with setmaxnreg), so a warpgroup's promotion overlaps its
// own next wgmmas and not only the other warpgroup's. Same products and the same promotion order per accumulator as
// ws_consumer (bit-equal). A slow block waits for everything in flight (its per-32 steps use wait_group 0).
struct WsCursor {
  Tile tile;
  int t, kb;
};

template <int kStages>
__device__ __forceinline__ void ws_cursor_next(WsCursor& c, const Params& p, const int* prefix, int my_tiles,
                                               int kblocks, int n_tiles) {
  if (++c.kb == kblocks) {
    c.kb = 0;
    ++c.t;
    if (c.t < my_tiles) c.tile = decode_tile<128>(blockIdx.x + c.t * gridDim.x, prefix, p.offs, p.g, p.m, n_tiles);
  }
}

// Wait for block sp's stage, load its activation scales, issue its four wgmmas into t (fast blocks). Returns slow.
template <int kStages>
__device__ __forceinline__ bool ws_issue(float* t, uint8_t* smem, int sp, const WsCursor& c, const Params& p,
                                         int r_off, int cw, float& sa0, float& sa1) {
  using L = WsLayout<kStages>;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  const int stage = sp % kStages, ks = p.k / kBK;
  uint8_t* st = smem + stage * L::kStage;
  const int r0 = c.tile.row0 + r_off;
  sa0 = __ldg(p.sfa + (size_t)(r0 < c.tile.rend ? r0 : 0) * ks + c.kb);
  sa1 = __ldg(p.sfa + (size_t)(r0 + 8 < c.tile.rend ? r0 + 8 : 0) * ks + c.kb);
  mbar_wait(&full[stage], (uint32_t)((sp / kStages) & 1));
  const bool slow = *reinterpret_cast<const volatile int*>(st + L::kMode) == kAbsSlow;
  if (!slow) {
    const uint32_t a_base = smem_u32(st) + cw * 64 * 128, b_base = smem_u32(st + L::kB);
    wg_arrive();
#pragma unroll
    for (int j = 0; j < 4; ++j) wgmma_m64n128k32_e4m3(t, gmma_desc(a_base + 32 * j), gmma_desc(b_base + 32 * j), j);
    wg_commit();
  }
  return slow;
}

// Promote block sp from t (pending: another block's wgmma group was committed after it), release its stage, store
// the tile after its last block.
template <int kStages>
__device__ __forceinline__ void ws_finish(float* acc, float* t, uint8_t* smem, int sp, bool slow, bool pending,
                                          WsCursor& c, const Params& p, const int* prefix, int my_tiles, int kblocks,
                                          int n_tiles, int r_off, int cw, float sa0, float sa1) {
  using L = WsLayout<kStages>;
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kBar) + kStages;
  const int stage = sp % kStages;
  uint8_t* st = smem + stage * L::kStage;
  const float* colf = reinterpret_cast<const float*>(st + L::kF);
  if (!slow) {
    if (pending) {
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    } else {
      wg_wait0();
    }
    reg_fence<64>(t);
    promote(acc, t, colf, sa0, sa1);
  } else {
    const uint32_t a_base = smem_u32(st) + cw * 64 * 128, b_base = smem_u32(st + L::kB);
#pragma unroll 1
    for (int j = 0; j < 4; ++j) {
      wg_arrive();
      wgmma_m64n128k32_e4m3(t, gmma_desc(a_base + 32 * j), gmma_desc(b_base + 32 * j), 0);
      wg_commit();
      wg_wait0();
      reg_fence<64>(t);
      promote(acc, t, colf + j * kBN, sa0, sa1);
    }
  }
  mbar_arrive(&empty[stage]);
  if (c.kb + 1 == kblocks) store_tile(p, c.tile, acc, c.tile.row0 + r_off);
  ws_cursor_next<kStages>(c, p, prefix, my_tiles, kblocks, n_tiles);
}

template <int kStages>
__device__ void ws_consumer_pipe(const Params& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                                 int n_tiles) {
  const int tid = threadIdx.x - 128, lane = tid & 31, cw = tid >> 7;
  const int r_off = 64 * cw + 16 * ((tid >> 5) & 3) + (lane >> 2);
  const int steps = my_tiles * kblocks;
  float acc[64], ta[64], tb[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  WsCursor ic, fc;  // issue / finish cursors (the issue cursor runs one block ahead)
  ic.tile = decode_tile<128>(blockIdx.x, prefix, p.offs, p.g, p.m, n_tiles);
  ic.t = ic.kb = 0;
  fc = ic;
  float a0, a1, b0, b1;
  bool slow_a = ws_issue<kStages>(ta, smem, 0, ic, p, r_off, cw, a0, a1);
  ws_cursor_next<kStages>(ic, p, prefix, my_tiles, kblocks, n_tiles);
  for (int sp = 0; sp < steps; sp += 2) {  // ta holds block sp, tb block sp + 1
    const bool has_b = sp + 1 < steps;
    bool slow_b = false;
    if (has_b) {
      slow_b = ws_issue<kStages>(tb, smem, sp + 1, ic, p, r_off, cw, b0, b1);
      ws_cursor_next<kStages>(ic, p, prefix, my_tiles, kblocks, n_tiles);
    }
    ws_finish<kStages>(acc, ta, smem, sp, slow_a, has_b && !slow_b, fc, p, prefix, my_tiles, kblocks, n_tiles, r_off,
                       cw, a0, a1);
    if (!has_b) break;
    const bool has_a = sp + 2 < steps;
    if (has_a) {
      slow_a = ws_issue<kStages>(ta, smem, sp + 2, ic, p, r_off, cw, a0, a1);
      ws_cursor_next<kStages>(ic, p, prefix, my_tiles, kblocks, n_tiles);
    }
    ws_finish<kStages>(acc, tb, smem, sp + 1, slow_b, has_a && !slow_a, fc, p, prefix, my_tiles, kblocks, n_tiles,
                       r_off, cw, b0, b1);
  }
}

// kPipe: pipelined consumers (ws_consumer_pipe) with setmaxnreg (producer 56, consumers 224 registers: 40 / 232
// made ptxas spill 12 bytes).
template <int kStages, bool kPipe = false>
__global__ void __launch_bounds__(384, 1) w4a8_ws_kernel(const Params p) {
  using L = WsLayout<kStages>;
  static_assert(kStages >= 3, "the ring needs >= 3 stages (one loading, one converted, one consumed)");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x;
  int* prefix = reinterpret_cast<int*>(smem + L::kPrefix);
  const int n_tiles = (p.n + kBN - 1) / kBN, kblocks = p.k / kBK;
  if (tid < 120) {  // LUT as w4a8_grouped_kernel
    const int d = tid >> 3, c = tid & 7;
    const float mag = c < 2 ? 0.5f * c : ldexpf(1.f + 0.5f * (c & 1), (c >> 1) - 1);
    smem[L::kLut + tid] = (uint8_t)__nv_cvt_float_to_fp8(ldexpf(mag, 6 - d), __NV_SATFINITE, __NV_E4M3);
  }
  if (tid == 0) {
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 128);               // every producer thread arrives (each fenced its own writes)
      mbar_init(&full[kStages + s], 256);     // every consumer thread arrives
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  build_prefix<L::kBM, L::kThreads>(prefix, reinterpret_cast<int*>(smem + L::kScan), p.offs, p.g, p.m, n_tiles);
  const int total = prefix[p.g];
  const int my_tiles = total > (int)blockIdx.x ? (total - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  if (my_tiles == 0) return;
  if (tid < 128) {
    if constexpr (kPipe) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    ws_producer<kStages>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  } else if constexpr (kPipe) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    ws_consumer_pipe<kStages>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  } else {
    ws_consumer<kStages>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  }
}

}  // namespace dg_w4a8
