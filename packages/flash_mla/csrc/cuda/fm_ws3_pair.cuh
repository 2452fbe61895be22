// ws3p2 (session 11): the persistent ws3p kernel with BALANCED consumers ("pair" scheme, kOptPair). Included by
// fm_ws3pair_decode.cu after fm_ws3_decode.cu (FM_WS3_PAIR_TU), whose helpers, producers' tile code, Q load, item
// decomposition and epilogue it reuses; fm_ws3_decode.cu's own instances are untouched.
//
// Why: in ws3p1 consumer warpgroup 0 scores every 64-row tile and runs its softmax while warpgroup 1 only rescales
// and runs half of P V; the session-9 profile of the prefill case put 15 % of ALL samples on warpgroup 1 waiting for
// warpgroup 0's P (named barrier), i.e. warpgroup 1 idles about half its time, and the tensor pipe with it.
//
// Scheme (the tile-pair pipeline DeepSeek's FlashMLA prefill kernel uses on SM90, written here for this file's ring,
// P-in-shared-memory wgmma forms and split-KV epilogue): an item's tiles are taken in pairs (a = 2 i, b = 2 i + 1; an
// odd count is padded with one tile of holes). Tile a always sits in ring stage 0, b in stage 1 (items have an even
// number of tiles after padding, so the CTA's tile counter stays even at every item start). Each stage has two
// halves, L = dims 0..255 (sub-tiles 0-3) and R = 256..511, each with its own full / empty mbarrier, so the producer
// refills a half as soon as its last reader is done:
//   warpgroup 0: S_a = Q K_a^T (halves L then R), m0 = max(m_run, rowmax S_a) -> shared, P0' = exp2(S_a - m0) (bf16,
//     shared) and O_0 += P0' V_a[:, L] (its own P: issued at once), then waits for warpgroup 1's final max m1,
//     writes P0 = exp2(S_a - m1) for warpgroup 1 (from the fp32 scores, not re-rounded), rescales O_0 / l by
//     exp2(m0 - m1) once its own P V is done (releases a.L), then O_0 += P1 V_b[:, L] (releases b.L).
//   warpgroup 1: S_b = Q K_b^T (halves R then L), waits for m0, m1 = max(m0, rowmax S_b) -> shared (the pair's final
//     max: m1 >= m0 >= m_run), P1 = exp2(S_b - m1) (shared), O_1 *= exp2(m_run - m1), O_1 += P1 V_b[:, R] (releases
//     b.R), then O_1 += P0 V_a[:, R] (releases a.R).
//   producer: per pair, in release order a.L, b.R, a.R, b.L (BF16: cp.async per half, arrival on the half's full
//     barrier; FP8: whole tiles, a after a.L + a.R, b after b.R + b.L, dequantised by fp8v_tile).
// Both warpgroups score a whole tile (m64n64k16, as ws3p1's scorer) and run half of every P V, so their work is equal;
// one warpgroup's softmax overlaps the other's wgmmas (the staggered max: warpgroup 0 does not wait for warpgroup 1
// before its own P V). Four named-barrier hand-overs per pair (m0, m1, P0, P1), each one-sided (bar.arrive by the
// producer of the value, bar.sync by its reader).
// Row sums: each warpgroup sums its own tiles' P (warpgroup 0's at scale m1 after the rescale), finish() adds them.
// Same math as ws3p1 (exact softmax with sink, split-KV partials), another summation order: GPU tests compare with the
// reference / float64 oracle and with ws3p1 within bf16 tolerance, not bit for bit.
#pragma once

namespace fm_ws3 {

constexpr int kOptPair = 128;
// Timing-only ablations of the pair kernel (opt bits on top of kOptPair; wrong results): kPairProdOnly 256, the
// consumers only wait for the halves they would read and release theirs (the producer's feed rate); kPairConsOnly 512,
// the producer copies nothing (waits for the releases, then arrives on the full barriers: the consumers' own rate).
constexpr int kPairProdOnly = 256, kPairConsOnly = 512;
// kPairRegStage (1024, BF16 cache): the producer loads a half tile (64 rows x 512 B = 16 x 16 B per thread) into
// registers BEFORE waiting for the half's release, then stores it (st.shared) and arrives; with cp.async the gather
// could only start after the release, so each release -> reload round trip (~a global-memory latency) stalled the
// reading warpgroup (session-11 profile of the cp.async build: warpgroup 0 ~45 % of its samples on full barriers).
constexpr int kPairRegStage = 1024;
// named barriers of the pair hand-overs (ids 1 / 2: consumers / producer, 3 / 4: one consumer warpgroup)
constexpr int kBarM0 = 5, kBarM1 = 6, kBarP0 = 7, kBarP1 = 8;
// per-warpgroup register split (setmaxnreg: producer 88, the FP8 batch; consumers share the rest)
constexpr int kPairRegsWg0 = 208, kPairRegsWg1 = 208;
static_assert(128 * 88 + 128 * kPairRegsWg0 + 128 * kPairRegsWg1 == 384 * 168, "setmaxnreg budget");
// kPairRegStage: 64 data registers in the producer
constexpr int kPairRegsProdR = 96, kPairRegsWg0R = 208, kPairRegsWg1R = 200;
static_assert(128 * kPairRegsProdR + 128 * kPairRegsWg0R + 128 * kPairRegsWg1R == 384 * 168, "setmaxnreg budget");

// Shared memory: ws3p's layout (Q, ring, P [2], row tables, lsum) and past its end a third P tile (P0 at the final
// scale, for warpgroup 1), the producer's pair row ids, the two max hand-overs and 8 mbarriers.
struct PairSmem {
  static constexpr int p3 = (Smem::total + 1023) / 1024 * 1024;  // bf16 [64, 64] swizzled (1 KiB aligned)
  static constexpr int prow = p3 + kSub;                          // int [2 parity][128]: rows of tiles a, b
  static constexpr int m0 = prow + 2 * 128 * 4;                   // float [64]
  static constexpr int m1 = m0 + 64 * 4;                          // float [64]
  static constexpr int bars = m1 + 64 * 4;                        // uint64 full[stage][half], empty[stage][half]
  static constexpr int total = bars + 8 * 8;
};
static_assert(PairSmem::total + 1024 <= 232448, "shared memory over the sm_90 opt-in limit");

__device__ __forceinline__ uint32_t pair_full(uint32_t bars, int stage, int half) { return bars + 8 * (2 * stage + half); }
__device__ __forceinline__ uint32_t pair_empty(uint32_t bars, int stage, int half) {
  return bars + 32 + 8 * (2 * stage + half);
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ------------------------------------------------------------------------------------------------ pair stream
// Tiles of an item after padding to an even count (a lone last tile gets a partner of holes).
__device__ __forceinline__ int pair_tiles(int n) { return (n + 1) & ~1; }

// The producer's position: pair (tiles j, j + 1) of item w; the Cursor fields as in the ws3p producer.
__device__ __forceinline__ void pcursor_settle(Cursor& c, const Params& p, int n_tiles, int64_t items) {
  while (c.w < items && c.j >= pair_tiles(c.n)) {
    c.w += gridDim.x;
    c.j = 0;
    if (c.w < items) {
      const Item it = item_of(c.w, p, n_tiles);
      c.tok = it.tok, c.lo = it.lo, c.n = it.n;
    }
  }
}
__device__ __forceinline__ Cursor pcursor_first(const Params& p, int n_tiles, int64_t items) {
  Cursor c{(int64_t)blockIdx.x, 0, 0, 0, 0};
  const Item it = item_of(c.w, p, n_tiles);
  c.tok = it.tok, c.lo = it.lo, c.n = it.n;
  pcursor_settle(c, p, n_tiles, items);
  return c;
}
__device__ __forceinline__ void pcursor_next(Cursor& c, const Params& p, int n_tiles, int64_t items) {
  c.j += 2;
  pcursor_settle(c, p, n_tiles, items);
}
// Row id of producer thread t's entry of the pair: t < 64 row t of tile a, else row t - 64 of tile b (-1: hole, the
// padding tile, or past the stream).
__device__ __forceinline__ int pcursor_row(const Cursor& c, const int* idx, const Params& p, int64_t items, int t) {
  const int tile = c.j + (t >> 6);
  if (c.w >= items || tile >= c.n) return -1;
  return load_row_id(idx + c.tok * p.stride_it, (c.lo + tile) * kBN + (t & 63), p.topk, p.n_rows);
}

// ------------------------------------------------------------------------------------------------ producer
// BF16 half h of a tile: thread t copies 16-byte chunk 32 h + (t % 32) of rows t / 32 + 4 i (one warp: 512
// contiguous bytes of a row per instruction; holes zero-filled, never read).
__device__ __forceinline__ void issue_bf16_half(uint32_t stage, const int* rows, const Src<false>& src, int t, int h) {
  const int c = 32 * h + (t & 31);
#pragma unroll 8
  for (int i = 0; i < kBN / 4; ++i) {
    const int r = (t >> 5) + 4 * i;
    const int row = rows[r];
    cp_async16(stage + swz(r, c, kBN), src.at(row < 0 ? 0 : row) + c * 16, row >= 0);
  }
}

// kPairRegStage: the same half into registers (holes: zeros), then into the ring (128-byte swizzle).
struct HalfRegs {
  uint4 v[kBN / 4];
};
__device__ __forceinline__ uint4 ldg16_if(const uint8_t* p, int row) {
  uint4 v;
  asm volatile(
      "{\n.reg .pred p;\nsetp.ge.s32 p, %5, 0;\nmov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
      "@p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(row));
  return v;
}
__device__ __forceinline__ void load_bf16_half(HalfRegs& r, const int* rows, const Src<false>& src, int t, int h) {
  const int c = 32 * h + (t & 31);
#pragma unroll
  for (int i = 0; i < kBN / 4; ++i) {
    const int row = rows[(t >> 5) + 4 * i];
    r.v[i] = ldg16_if(src.at(row < 0 ? 0 : row) + c * 16, row);
  }
}
__device__ __forceinline__ void store_bf16_half(uint32_t stage, const HalfRegs& r, int t, int h) {
  const int c = 32 * h + (t & 31);
#pragma unroll
  for (int i = 0; i < kBN / 4; ++i) sts128(stage + swz((t >> 5) + 4 * i, c, kBN), r.v[i]);
}

// Producer thread t (0..127) over the CTA's pair stream. Pair k's halves go out in release order; each waits for the
// release of the same half in pair k - 1 (parity (k - 1) & 1). Row tables: stage 0's with a.L (its reader, warpgroup
// 0's mask, has released a.L by then), stage 1's with b.R.
template <bool FP8, int MODE, bool REG>
__device__ __forceinline__ void producer_pair(uint8_t* smem, const uint8_t* kv_base, const int* idx, const Params& p,
                                              int64_t items, int t, uint32_t bars) {
  int* s_rows = reinterpret_cast<int*>(smem + Smem::rows);  // [stage][64]
  int* prow = reinterpret_cast<int*>(smem + PairSmem::prow);
  const Src<false> kv{kv_base, FP8 ? kFp8Row : p.stride_kv * 2, nullptr, 0, 0};
  const uint32_t ring = smem_u32(smem + Smem::ring);
  const int n_tiles = (p.topk + kBN - 1) / kBN;
  Cursor a = pcursor_first(p, n_tiles, items);
  Cursor b = a;
  pcursor_next(b, p, n_tiles, items);
  int cur = pcursor_row(a, idx, p, items, t);
  int nxt = pcursor_row(b, idx, p, items, t);
  for (uint32_t k = 0; a.w < items; ++k) {
    const bool wait = k > 0;
    const uint32_t par = (k - 1) & 1;
    prow[(k & 1) * 128 + t] = cur;
    named_bar(kBarProducer, 128);  // the pair's row ids visible to every producer thread
    const int* rows = prow + (k & 1) * 128;
    if constexpr (MODE == kPairConsOnly) {  // ablation: no copies; the release order of the real loop
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // (stage, half) = a.L, b.R, a.R, b.L
        const int st = i & 1, h = (i ^ (i >> 1)) & 1;
        if (wait) mbar_wait(pair_empty(bars, st, h), par);
        if (i < 2 && (t < kBN) == (i == 0)) s_rows[t] = cur;
        mbar_arrive(pair_full(bars, st, h));
      }
    } else if constexpr (REG) {  // BF16 through registers: each half's loads go out before its release wait
#pragma unroll 1
      for (int i = 0; i < 4; ++i) {  // (stage, half) = a.L, b.R, a.R, b.L
        const int st = i & 1, h = (i ^ (i >> 1)) & 1;
        HalfRegs r;
        load_bf16_half(r, rows + st * kBN, kv, t, h);
        if (wait) mbar_wait(pair_empty(bars, st, h), par);
        if (i < 2 && (t < kBN) == (i == 0)) s_rows[t] = cur;
        store_bf16_half(ring + st * kStageBytes, r, t, h);
        fence_async_smem();
        mbar_arrive(pair_full(bars, st, h));
      }
      if (nxt >= 0) {
        const uint8_t* row = kv.at(nxt);
#pragma unroll
        for (int i = 0; i < 9; ++i) prefetch_l2(row + (i < 8 ? 128 * i : 1023));
      }
    } else if constexpr (FP8) {
      // t' = t for tile a (threads t < 64 hold its row ids), (t + 64) % 128 for tile b (threads 64.. hold them)
      if (wait) mbar_wait(pair_empty(bars, 0, 0), par);
      fp8v_tile(smem + Smem::ring, rows, kv_base, wait, pair_empty(bars, 0, 1), par, s_rows, cur, t);
      fence_async_smem();
      mbar_arrive(pair_full(bars, 0, 0));
      mbar_arrive(pair_full(bars, 0, 1));
      if (wait) mbar_wait(pair_empty(bars, 1, 1), par);
      fp8v_tile(smem + Smem::ring + kStageBytes, rows + 64, kv_base, wait, pair_empty(bars, 1, 0), par, s_rows + kBN,
                cur, (t + 64) & 127);
      fence_async_smem();
      mbar_arrive(pair_full(bars, 1, 1));
      mbar_arrive(pair_full(bars, 1, 0));
      if (nxt >= 0) {
        const uint8_t* row = kv.at(nxt);
#pragma unroll
        for (int i = 0; i < 6; ++i) prefetch_l2(row + (i < 5 ? 128 * i : 583));
      }
    } else {
      if (wait) mbar_wait(pair_empty(bars, 0, 0), par);
      if (t < kBN) s_rows[t] = cur;
      issue_bf16_half(ring, rows, kv, t, 0);
      cp_async_mbar_arrive(pair_full(bars, 0, 0));
      if (wait) mbar_wait(pair_empty(bars, 1, 1), par);
      if (t >= kBN) s_rows[t] = cur;  // stage 1's table: s_rows[kBN + (t - kBN)]
      issue_bf16_half(ring + kStageBytes, rows + kBN, kv, t, 1);
      cp_async_mbar_arrive(pair_full(bars, 1, 1));
      if (wait) mbar_wait(pair_empty(bars, 0, 1), par);
      issue_bf16_half(ring, rows, kv, t, 1);
      cp_async_mbar_arrive(pair_full(bars, 0, 1));
      if (wait) mbar_wait(pair_empty(bars, 1, 0), par);
      issue_bf16_half(ring + kStageBytes, rows + kBN, kv, t, 0);
      cp_async_mbar_arrive(pair_full(bars, 1, 0));
      if (nxt >= 0) {  // the next pair's rows into L2 while this pair computes
        const uint8_t* row = kv.at(nxt);
#pragma unroll
        for (int i = 0; i < 9; ++i) prefetch_l2(row + (i < 8 ? 128 * i : 1023));
      }
    }
    a = b;
    pcursor_next(b, p, n_tiles, items);
    cur = nxt;
    nxt = pcursor_row(b, idx, p, items, t);
  }
  if constexpr (!FP8 && !REG && MODE != kPairConsOnly) cp_wait_all();  // no thread exits with copies in flight
}

// ------------------------------------------------------------------------------------------------ consumers
// S [64 heads x 64 keys] += Q [64, dims of half h] K[0 .. 63, same dims]^T: 16 x m64n64k16 (first: overwrite).
__device__ __forceinline__ void issue_scores64_half(float* s, uint32_t q_base, uint32_t kv_base, int h, bool first) {
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int ks = 16 * h + k;
    const uint32_t koff = (ks >> 2) * kSub + (ks & 3) * 32;
    ws3_wgmma_m64n64k16_ss(s, gmma_desc(q_base + koff, 16, 1024), gmma_desc(kv_base + koff, 16, 1024),
                           first && k == 0 ? 0 : 1);
  }
}

// Scores of this warpgroup's tile (stage WG, pair parity ph): half WG first (warpgroup 0: L, 1: R), then the other,
// each after its full barrier; complete on return.
template <int WG>
__device__ __forceinline__ void pair_scores(float* s, uint32_t q_base, uint32_t stage, uint32_t bars, uint32_t ph) {
  mbar_wait(pair_full(bars, WG, WG), ph);
  fence_async_smem();
  reg_fence<32>(s);
  wg_arrive();
  issue_scores64_half(s, q_base, stage, WG, true);
  mbar_wait(pair_full(bars, WG, 1 - WG), ph);
  fence_async_smem();
  wg_arrive();
  issue_scores64_half(s, q_base, stage, 1 - WG, false);
  wg_commit();
  wg_wait<0>();
  reg_fence<32>(s);
}

// Scale by qk_scale (base 2), -inf for holes (rows_t), row maxima of the thread's two rows over the warp's quad.
__device__ __forceinline__ void pair_mask_max(float* s, const int* rows_t, int lane, float qk_scale, float* mx) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
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
  }
}

// P = exp2(s - m) (m finite per row) as bf16 into the swizzled [64, 64] tile; SUM: l_run[h] += the fp32 row sums.
template <bool SUM>
__device__ __forceinline__ void pair_write_p(const float* s, const float* m, uint8_t* p_tile, float* l_run, int r0,
                                             int lane) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float p0 = exp2f(s[4 * j + 2 * h] - m[h]), p1 = exp2f(s[4 * j + 2 * h + 1] - m[h]);
      if constexpr (SUM) l_run[h] += p0 + p1;
      const int r = r0 + 8 * h;
      *reinterpret_cast<__nv_bfloat162*>(p_tile + r * 128 + (((col >> 3) ^ (r & 7)) << 4) + (col & 7) * 2) =
          __floats2bfloat162_rn(p0, p1);
    }
  }
}

__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }

// One pair, warpgroup 0 (tile a in stage 0). On return O_0 / l_run are at the pair's final max m1 (= m_run).
__device__ __forceinline__ void pair_wg0(float* s, float* acc, float* m_run, float* l_run, uint8_t* smem,
                                         uint32_t q_base, uint32_t ring, uint32_t bars, uint32_t ph, int r0, int lane,
                                         float qk_scale) {
  const int* s_rows = reinterpret_cast<const int*>(smem + Smem::rows);
  float* xm0 = reinterpret_cast<float*>(smem + PairSmem::m0);
  const float* xm1 = reinterpret_cast<const float*>(smem + PairSmem::m1);
  uint8_t* p_own = smem + Smem::p;
  pair_scores<0>(s, q_base, ring, bars, ph);
  float mx[2], m0[2], mu[2], alpha[2];
  pair_mask_max(s, s_rows, lane, qk_scale, mx);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m0[h] = fmaxf(m_run[h], mx[h]);
    mu[h] = finite_or_zero(m0[h]);
    alpha[h] = exp2f(m_run[h] - mu[h]);
    l_run[h] *= alpha[h];
  }
  if ((lane & 3) == 0) {
    xm0[r0] = m0[0];
    xm0[r0 + 8] = m0[1];
  }
  named_arrive(kBarM0, kConsumers);  // m0 -> warpgroup 1
  pair_write_p<true>(s, mu, p_own, l_run, r0, lane);
  rescale_o(acc, alpha);
  fence_async_smem();          // P (generic stores) -> wgmma (async proxy)
  named_bar(kBarWg0, 128);     // all of P0' written
  reg_fence<128>(acc);
  wg_arrive();
  issue_pv(acc, smem_u32(p_own), ring, 0);  // O_0 += P0' V_a[:, L]
  wg_commit();
  named_bar(kBarM1, kConsumers);  // the pair's final max from warpgroup 1
  float m1[2], f[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m1[h] = finite_or_zero(xm1[r0 + 8 * h]);
    f[h] = m0[h] == -INFINITY ? 1.f : exp2f(m0[h] - m1[h]);  // (m0 = -inf: O_0, l_run are still 0)
    m_run[h] = xm1[r0 + 8 * h];
  }
  pair_write_p<false>(s, m1, smem + PairSmem::p3, l_run, r0, lane);  // P0 at the final scale, for warpgroup 1
  fence_async_smem();
  named_arrive(kBarP0, kConsumers);
  wg_wait<0>();
  reg_fence<128>(acc);
  mbar_arrive(pair_empty(bars, 0, 0));  // a.L read for the last time (scores and the own P V)
  rescale_o(acc, f);
#pragma unroll
  for (int h = 0; h < 2; ++h) l_run[h] *= f[h];
  named_bar(kBarP1, kConsumers);  // P1 from warpgroup 1
  reg_fence<128>(acc);
  wg_arrive();
  issue_pv(acc, smem_u32(smem + Smem::p + kSub), ring + kStageBytes, 0);  // O_0 += P1 V_b[:, L]
  wg_commit();
  wg_wait<0>();
  reg_fence<128>(acc);
  mbar_arrive(pair_empty(bars, 1, 0));  // b.L done
}

// One pair, warpgroup 1 (tile b in stage 1): its max is the pair's final one.
__device__ __forceinline__ void pair_wg1(float* s, float* acc, float* m_run, float* l_run, uint8_t* smem,
                                         uint32_t q_base, uint32_t ring, uint32_t bars, uint32_t ph, int r0, int lane,
                                         float qk_scale) {
  const int* s_rows = reinterpret_cast<const int*>(smem + Smem::rows) + kBN;
  const float* xm0 = reinterpret_cast<const float*>(smem + PairSmem::m0);
  float* xm1 = reinterpret_cast<float*>(smem + PairSmem::m1);
  uint8_t* p_own = smem + Smem::p + kSub;
  pair_scores<1>(s, q_base, ring + kStageBytes, bars, ph);
  float mx[2], mu[2], alpha[2];
  pair_mask_max(s, s_rows, lane, qk_scale, mx);
  named_bar(kBarM0, kConsumers);  // m0 (>= m_run) from warpgroup 0
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m1 = fmaxf(xm0[r0 + 8 * h], mx[h]);
    mu[h] = finite_or_zero(m1);
    alpha[h] = exp2f(m_run[h] - mu[h]);
    l_run[h] *= alpha[h];
    m_run[h] = m1;
  }
  if ((lane & 3) == 0) {
    xm1[r0] = m_run[0];
    xm1[r0 + 8] = m_run[1];
  }
  named_arrive(kBarM1, kConsumers);
  pair_write_p<true>(s, mu, p_own, l_run, r0, lane);
  rescale_o(acc, alpha);
  fence_async_smem();
  named_arrive(kBarP1, kConsumers);  // P1 -> warpgroup 0 (each thread arrives after its own writes and fence)
  named_bar(kBarWg0 + 1, 128);       // all of P1 written (for this warpgroup's own P V)
  reg_fence<128>(acc);
  wg_arrive();
  issue_pv(acc, smem_u32(p_own), ring + kStageBytes, 1);  // O_1 += P1 V_b[:, R]
  wg_commit();
  named_bar(kBarP0, kConsumers);  // P0 (final scale) from warpgroup 0
  wg_arrive();
  issue_pv(acc, smem_u32(smem + PairSmem::p3), ring, 1);  // O_1 += P0 V_a[:, R]
  wg_commit();
  wg_wait<1>();
  mbar_arrive(pair_empty(bars, 1, 1));  // b.R done
  wg_wait<0>();
  reg_fence<128>(acc);
  mbar_arrive(pair_empty(bars, 0, 1));  // a.R done
}

// Warpgroup WG's item loop (consumer_p1's structure: Q hand-over, accumulators, epilogue). The next item's Q is loaded
// during the last pair, once both warpgroups' scores are complete (warpgroup 0 knows it at the m1 hand-over,
// warpgroup 1 at the m0 hand-over; each loads its own half of Q's rows (issue_q by tid) after its own pair step).
// kPairProdOnly: wait for the halves warpgroup WG reads (its tile's two, the peer tile's half WG), release its own.
template <int WG>
__device__ __forceinline__ void pair_waits_only(uint32_t bars, uint32_t ph) {
  mbar_wait(pair_full(bars, WG, 0), ph);
  mbar_wait(pair_full(bars, WG, 1), ph);
  mbar_wait(pair_full(bars, 1 - WG, WG), ph);
  mbar_arrive(pair_empty(bars, WG, WG));
  mbar_arrive(pair_empty(bars, 1 - WG, WG));
}

template <int WG, int MODE>
__device__ __forceinline__ void consumer_pair(uint8_t* smem, const __nv_bfloat16* q, const float* sink,
                                              __nv_bfloat16* out, float* lse, float* part_o, float* part_lse,
                                              const Params& p, int64_t items, int tid, uint32_t bars) {
  const int lane = tid & 31;
  const int r0 = ((tid & 127) >> 5) * 16 + (lane >> 2);
  const uint32_t q_base = smem_u32(smem + Smem::q), ring = smem_u32(smem + Smem::ring);
  const int n_tiles = (p.topk + kBN - 1) / kBN;
  uint32_t k = 0;
  bool q_loaded = false;
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const Item it = item_of(w, p, n_tiles);
    const int64_t wn = w + gridDim.x;
    if (!q_loaded) issue_q(q, p, it.tok, it.hb, q_base, tid);
    cp_wait_all();
    fence_async_smem();
    named_bar(kBarConsumers, kConsumers);  // Q of this item in place (also: the last item's lsum reads are done)
    q_loaded = false;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    const int pairs = pair_tiles(it.n) / 2;
    for (int i = 0; i < pairs; ++i, ++k) {
      if constexpr (MODE == kPairProdOnly) {
        pair_waits_only<WG>(bars, k & 1);
      } else if constexpr (WG == 0) {
        pair_wg0(s, acc, m_run, l_run, smem, q_base, ring, bars, k & 1, r0, lane, p.qk_scale);
      } else {
        pair_wg1(s, acc, m_run, l_run, smem, q_base, ring, bars, k & 1, r0, lane, p.qk_scale);
      }
      if (i == pairs - 1 && wn < items) {  // both warpgroups' Q reads are done (see above)
        uint32_t tx;  // (re-read, opaque: else its row addresses are computed at the item's start and spilled)
        asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tx));
        const Item nx = item_of(wn, p, n_tiles);
        issue_q(q, p, nx.tok, nx.hb, q_base, (int)tx);
        q_loaded = true;
      }
    }
    finish(acc, m_run, l_run, reinterpret_cast<float*>(smem + Smem::lsum), sink, out, lse, part_o, part_lse, p, it.tok,
           it.hb, it.split, WG, r0, lane);
  }
}

template <bool FP8, int MODE, bool REG = false>
__global__ void __launch_bounds__(384, 1)
    ws3p_pair_kernel(const __nv_bfloat16* __restrict__ q, const uint8_t* __restrict__ kv, const int* __restrict__ idx,
                     const float* __restrict__ sink, __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                     float* __restrict__ part_o, float* __restrict__ part_lse, Params p, int64_t items) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // 1 KiB alignment (as ws3)
  const uint32_t bars = smem_u32(smem + PairSmem::bars);
  const int tid = threadIdx.x;
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      mbar_init(bars + 8 * i, 128);       // full: the 128 producer threads
      mbar_init(bars + 32 + 8 * i, 128);  // empty: the one consumer warpgroup that reads the half last
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid >= kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REG ? kPairRegsProdR : 88));
    producer_pair<FP8, MODE, REG>(smem, kv, idx, p, items, tid - kConsumers, bars);
  } else if (tid < 128) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REG ? kPairRegsWg0R : kPairRegsWg0));
    consumer_pair<0, MODE>(smem, q, sink, out, lse, part_o, part_lse, p, items, tid, bars);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REG ? kPairRegsWg1R : kPairRegsWg1));
    consumer_pair<1, MODE>(smem, q, sink, out, lse, part_o, part_lse, p, items, tid, bars);
  }
}

// Grid min(#SMs or max_ctas, items), as launch_persist.
template <bool FP8, int MODE = 0, bool REG = false>
static int launch_pair(const LaunchArgs& a, int max_ctas, cudaStream_t stream) {
  const int smem = PairSmem::total + 1024;  // + alignment slack
  auto kern = ws3p_pair_kernel<FP8, MODE, REG>;
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
  return launch_kernel(kern, grid, 384, smem, stream, a, items);
}

}  // namespace fm_ws3
