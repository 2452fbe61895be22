// W4A8 M-grouped GEMM (sm_90a), scheme "rs": the weights are the wgmma's REGISTER operand (CUTLASS's mixed-input
// Hopper GEMM swaps A and B the same way). Same tiles (128 tokens x 128 weight rows, 128-deep k blocks), schedule,
// scale numerics and promotion order as cuda_wg2s4 / cuda_ws2s4 (dg_w4a8_grouped.cuh), but the converted e4m3 weight
// tile never goes through shared memory:
//
//   warpgroup 0 (producer): cp.async of the activation tile X [128 tokens, 128] (128-byte swizzle), the packed weights
//     [128, 64] (16-byte chunks XOR-swizzled by (row / 2) % 4: the consumers' fragment loads are conflict-free), the
//     E8M0 bytes and the 128 tokens' activation scales of k-block lp into ring stage lp % S (after the consumers
//     released it: empty mbarrier); D = S - 2 blocks behind, once its copies landed, the block's CTA-wide slow flag
//     (bar.red.or over the 128 weight rows, as ws_convert) and a full-mbarrier arrive.
//   warpgroups 1, 2 (consumers, 64 weight rows each): per k32 slice j, load the packed codes of the thread's m64k32
//     A fragment straight from shared memory (one 16-byte chunk per row, two rows), convert to e4m3 in registers with
//     the LUT of code * 2^(6 - d_j) (d_j = s_max - s_j fast, 0 slow), wgmma.fence and issue the RS wgmma
//     D^T[64 weight rows x 128 tokens] += W_j x X_j^T (slice j + 1 is converted while slice j's wgmma runs); promote
//     once per block: acc[n][m] += tmp[n][m] * (fa[m] * fw[n]) with fw = 2^(s_max - 133) (the per-32 path: four k32
//     steps, fw_j = 2^(s_j - 133)), arrive empty[stage]; the epilogue stores the transposed tile as bf16 rows of D.
//
// Numerics: the same e4m3 weights, the same activation bytes, the same k32 wgmma order and the same promotion
// products as cuda_wg2s4 (fa * fw, fmaf into acc per block). Only the MMA's operand roles are swapped; whether the
// tensor core's internal sum of a k32 step is order-identical under the swap is not documented, so the GPU tests
// check against float64 and REPORT bit-equality with cuda_wg2s4 (tests/test_dg_w4a8_rs.py).
//
// kTok = 256 ("rs ... n256"): 256-token tiles; a consumer's four converted fragments of a block feed two n128 wgmma
// groups (tokens 0..127, then 128..255, each into tmp and promoted into its own acc half): half the weight
// conversions per FLOP. Same per-element arithmetic as kTok = 128.
//
// kFold ("rs ... f", schemes 6 / 7): row-reference scales as cuda_wg2s4r (w4a8_sref_kernel pre-pass: s_ref = the
// weight row's largest scale byte over all k, "bad" = span > kRelSpan or a NaN byte). In a tile without a bad row
// the codes of a block are stored relative to s_ref (d_j = s_ref - s_j) when every row of the CTA has
// s_ref - min_j s_j <= kMaxShift (kRelFast): the promotion is ONE FFMA per accumulator, acc += tmp * fa[token]
// (no per-block weight factor), and the epilogue multiplies each weight row once by 2^(s_ref - 133). Otherwise, if
// every row's block spread s_max - min s_j <= kMaxShift (kRelMid): codes relative to s_max, promoted with
// fa * 2^(s_max - s_ref) (exact: a power of two >= 2^-kRelSpan); else the per-32 path with 2^(s_j - s_ref)
// (kRelSlow, cuda_wg2s4r's relative per-32 factors). Tiles with a bad row run the absolute scheme above. Same
// products as cuda_wg2s4r except kRelMid (wg2s4r takes the per-32 path there): the GPU tests check float64 and
// report bit-equality with cuda_wg2s4r.
//
// kCheap ("rs ... fc", scheme 8, with kFold): the same conversion in fewer instructions (rs_frag_c; bit-identical
// bytes, proven on the CPU by tests/test_dg_w4a8_rs.py::test_rs_cheap_conversion_model over every code and d):
// the two 4-byte words of a row's fragment are loaded directly (two LDS.32 at a per-thread offset instead of one
// LDS.128 + two SELs), the LUT pair is one LDS.64, the four d_j of a row are one packed word per block
// (m * 0x01010101 - sc: no borrows since m >= every s_j) and each is extracted with one PRMT, and the nibble masks
// are shared by both halves of an 8-code word (PRMT reads only the low 16 selector bits).
//
// kEpi ("rs ... e", schemes 9 / 10): the fast epilogue. The baseline (rs_store) converts and stores every element on
// its own (a 2-byte scattered st.global each); ablation F (no stores) measured it at ~46 % of the kernel's time.
// rs_store_smem converts pairs with cvt.rn.bf16x2.f32 (the same round-to-nearest-even per element as
// __float2bfloat16_rn: bit-equal output), writes the 64-row x 128-token fragment set of a consumer warpgroup
// transposed into its own 16 KiB staging buffer with stmatrix.m8n8.x4.trans (token rows of 128 bytes, 16-byte chunks
// XOR-swizzled by token % 8: conflict-free), syncs that warpgroup only (named barrier 2 + cw), then stores 16-byte
// chunks of whole token rows (8 threads = one 128-byte row: coalesced), skipping tokens past the group end and
// chunks past n. The staging buffers (2 x 16 KiB) sit after the largest group prefix (RsLayout::kEpiBuf): the ring,
// LUT, barriers and prefix keep their offsets, so the producer and the LUT / barrier code are the same.
//
// Registers: a consumer holds acc 64 (kTok 256: 128) + tmp 64 fp32 + 16 fragment registers (all four slices of a
// block stay live until the block's last wait): setmaxnreg moves registers from the producer to the consumers
// (RsLayout::kProdRegs / kConsRegs).
#pragma once
#include "dg_w4a8_rs_wgmma.cuh"
#include "dg_w4a8_ws.cuh"

namespace dg_w4a8 {

constexpr int kRelMid = 4;  // kFold block mode: codes relative to the block's s_max, factor 2^(s_max - s_ref)

// DIAGNOSTIC ablations (kAblate bit mask; dg_w4a8_rs_ablate.cu, never a user variant; results are WRONG, the builds
// exist only to be timed): each removes one part of the consumers' work. kAblate != 0 always takes the fast path
// (ignores the block mode). 0 = the real kernel (every `if constexpr` below folds away: same code).
//   kAblNoConv   (A): the fragment words are still loaded (LDS.128 + PRMT) but fed to the wgmma raw (no LUT, no
//                     FP4 -> e4m3 conversion); promotion, waits, epilogue kept.
//   kAblNoPromo  (B): the wgmmas accumulate straight into acc (no tmp, no per-block FFMA); the two token halves'
//                     eight wgmmas are one commit group and one wait per block (the per-half wait existed only
//                     because tmp is shared); conversion kept.
//   kAblNoMma    (C): no wgmma: an empty asm with the wgmma's operands (tmp "+f", fragment "r") keeps the
//                     conversion and the promotion alive; fences / commits / waits kept.
//   kAblProdOnly (D): consumers only wait full / arrive empty per block (+ the epilogue's stores of zeros): the
//                     producer's cp.async feed rate of the ring.
//   A | B        (E): wgmma + feed only: the ceiling of this structure.
//   kAblNoStore  (F): the epilogue stores nothing (acc kept alive by an empty asm): the epilogue's cost.
//   kAblNoFfma   (G): the promotion FFMAs skipped, but tmp and the per-half commit / wait kept: splits B's gain into
//                     the FFMAs' issue cost (G) and the tensor-core drain between the two halves (B - G).
constexpr int kAblNoConv = 1, kAblNoPromo = 2, kAblNoMma = 4, kAblProdOnly = 8, kAblNoStore = 16, kAblNoFfma = 32;

// kAblNoStore: no instruction, but every accumulator counts as used; zeroes acc as rs_store does.
__device__ __forceinline__ void rs_sink(float* acc) {
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    asm volatile("" ::"f"(acc[i]));
    acc[i] = 0.f;
  }
}

// kAblNoMma: no instruction, but d depends on a (as after a wgmma), so nothing upstream is deleted.
__device__ __forceinline__ void rs_fake_wgmma(float* d, const uint32_t* a) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]));
}

template <int kStages, int kTok = 128, bool kFold = false, bool kEpi = false>
struct RsLayout {  // (kCheap does not change the layout; kEpi only appends the staging buffers)
  static_assert(kTok == 128 || kTok == 256, "token tile: one or two wgmma n128 halves");
  static constexpr int kBM = kTok;               // tokens per tile (kTok / 128 wgmma n128 halves)
  static constexpr int kHalves = kTok / 128;
  static constexpr int kThreads = 384;           // producer + 2 consumers
  // setmaxnreg split (128 x prod + 256 x cons <= 65536): a 256-token consumer holds acc 2 x 64 + tmp 64 + 16
  // fragment registers (56 / 224 made ptxas spill 28 bytes there, 40 / 232 none)
  static constexpr int kProdRegs = kTok == 128 ? 56 : 40;
  static constexpr int kConsRegs = kTok == 128 ? 224 : 232;
  static constexpr int kX = 0;                   // e4m3 X tile [kTok, 128] (128-byte swizzle)
  static constexpr int kW = kBM * kBK;           // packed weights [128, 64] (chunk-swizzled)
  static constexpr int kS = kW + kBN * kBK / 2;  // E8M0 bytes [128, 4]
  static constexpr int kFa = kS + kBN * 4;       // float [kTok]: the tokens' activation scales of the block
  static constexpr int kMode = kFa + kBM * 4;    // int: block mode (kAbsFast / kAbsSlow)
  static constexpr int kR = kMode + 16;         // kFold: uint16 [128] the rows' s_ref | bad << 8
  static constexpr int kStage = (kR + (kFold ? 256 : 0) + 1023) / 1024 * 1024;
  static constexpr int kLut = kStages * kStage;  // uint8 [16][8]
  static constexpr int kBar = kLut + 128;        // uint64 full[S], empty[S]
  static constexpr int kScan = kBar + 16 * kStages;
  static constexpr int kPrefix = kScan + 64;     // int [g + 1]
  // kEpi: two consumer warpgroups' bf16 staging [128 tokens][64 weight rows] (16 KiB each), after the largest prefix
  static constexpr int kEpiBuf = (kPrefix + 4 * (kMaxGroups + 1) + 1023) / 1024 * 1024;
  static constexpr int kEpiBytes = 2 * 128 * 64 * 2;
  static constexpr int bytes(int g) { return kEpi ? kEpiBuf + kEpiBytes + 1024 : kPrefix + 4 * (g + 1) + 1024; }
};

// Byte offset of 16-byte chunk c (= k32 slice c: 32 codes) of packed weight row r in a stage.
__device__ __forceinline__ int rs_wchunk(int r, int c) { return r * 64 + ((c ^ ((r >> 1) & 3)) << 4); }

// ------------------------------------------------------------------------------------------------ producer

// Stage st <- k-block kb of `tile` (cp.async; producer thread ptid of 128). Token rows past the group end and weight
// rows past n read as zeros.
template <int kStages, int kTok, bool kFold>
__device__ __forceinline__ void rs_load(const Params& p, uint8_t* st, const Tile& tile, int kb, int ptid,
                                        uint32_t lref) {
  using L = RsLayout<kStages, kTok, kFold>;
  if constexpr (kFold) reinterpret_cast<uint16_t*>(st + L::kR)[ptid] = (uint16_t)lref;  // read back by this thread
  const uint32_t x_dst = smem_u32(st + L::kX), w_dst = smem_u32(st + L::kW);
#pragma unroll
  for (int idx = ptid; idx < L::kBM * 8; idx += 128) {
    const int r = idx >> 3, c = idx & 7, row = tile.row0 + r;
    const bool ok = row < tile.rend;
    const uint8_t* src = p.a + (size_t)(ok ? row : 0) * p.k + kb * kBK + c * 16;
    cp_async16(x_dst + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
  }
  const size_t wrow0 = (size_t)tile.grp * p.n;
#pragma unroll
  for (int idx = ptid; idx < kBN * 4; idx += 128) {
    const int r = idx >> 2, c = idx & 3, nr = tile.n0 + r;
    const bool ok = nr < p.n;
    const uint8_t* src = p.packed + (wrow0 + (ok ? nr : 0)) * (size_t)(p.k / 2) + kb * (kBK / 2) + c * 16;
    cp_async16(w_dst + rs_wchunk(r, c), src, ok);
  }
  {  // kBN == 128 producer threads: one weight row's scale bytes each
    const int nr = tile.n0 + ptid;
    const bool ok = nr < p.n;
    const uint8_t* src = p.scales + (wrow0 + (ok ? nr : 0)) * (size_t)(p.k / 32) + kb * 4;
    cp_async4(smem_u32(st + L::kS) + ptid * 4, src, ok);
  }
#pragma unroll
  for (int t = ptid; t < L::kBM; t += 128) {  // the tokens' activation scales
    const int row = tile.row0 + t;
    const bool tok = row < tile.rend;
    cp_async4(smem_u32(st + L::kFa) + t * 4, p.sfa + (size_t)(tok ? row : 0) * (p.k / kBK) + kb, tok);
  }
}

// kFold: thread ptid's row reference of `tile` (rows past n: 0, not bad; their scale bytes load as zeros).
__device__ __forceinline__ uint32_t rs_row_ref(const Params& p, const Tile& tile, int ptid) {
  const int nr = tile.n0 + ptid;
  return nr < p.n ? (uint32_t)__ldg(p.sref + (size_t)tile.grp * p.n + nr) : 0u;
}

// The block's CTA-uniform mode from every producer thread's row (scale word sc, reference word r16); producer only.
template <bool kFold>
__device__ __forceinline__ int rs_mode(uint32_t sc, uint32_t r16) {
  const uint32_t mn = min4(sc);
  const bool abs_slow = producer_or((max4(sc) - mn) > (uint32_t)kMaxShift) != 0;  // CTA-wide, as ws_convert
  if constexpr (kFold) {
    if (producer_or((int)(r16 >> 8)) == 0) {  // no bad row in the tile (tile-uniform: every thread takes this branch)
      const bool rel_slow = producer_or(((r16 & 0xffu) - mn) > (uint32_t)kMaxShift) != 0;
      return !rel_slow ? kRelFast : (abs_slow ? kRelSlow : kRelMid);
    }
  }
  return abs_slow ? kAbsSlow : kAbsFast;
}

template <int kStages, int kTok, bool kFold>
__device__ void rs_producer(const Params& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                            int n_tiles) {
  using L = RsLayout<kStages, kTok, kFold>;
  constexpr int kD = kStages - 2;  // blocks in flight between load and signal (one ready block while we wait)
  const int ptid = threadIdx.x;    // 0..127
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kStages;
  const int steps = my_tiles * kblocks;
  int lt = 0, lkb = 0;
  Tile ltile = decode_tile<L::kBM>(blockIdx.x, prefix, p.offs, p.g, p.m, n_tiles);
  uint32_t lref = kFold ? rs_row_ref(p, ltile, ptid) : 0u;  // once per tile
  for (int lp = 0; lp < steps + kD; ++lp) {
    if (lp < steps) {
      const int s = lp % kStages;
      if (lp >= kStages) mbar_wait(&empty[s], (uint32_t)((lp / kStages - 1) & 1));
      rs_load<kStages, kTok, kFold>(p, smem + s * L::kStage, ltile, lkb, ptid, lref);
      if (++lkb == kblocks) {
        lkb = 0;
        ++lt;
        if (lt < my_tiles) {
          ltile = decode_tile<L::kBM>(blockIdx.x + lt * gridDim.x, prefix, p.offs, p.g, p.m, n_tiles);
          if constexpr (kFold) lref = rs_row_ref(p, ltile, ptid);
        }
      }
    }
    cp_commit();  // always: keeps the group count uniform for cp_wait
    const int cv = lp - kD;
    if (cv >= 0) {
      cp_wait<kD>();  // this thread's copies of block cv have landed (it reads only its own scale word below)
      uint8_t* st = smem + (cv % kStages) * L::kStage;
      const uint32_t sc = reinterpret_cast<const uint32_t*>(st + L::kS)[ptid];
      const uint32_t r16 = kFold ? reinterpret_cast<const uint16_t*>(st + L::kR)[ptid] : 0u;
      const int mode = rs_mode<kFold>(sc, r16);
      if (ptid == 0) *reinterpret_cast<int*>(st + L::kMode) = mode;
      fence_async_smem();  // cp.async-written X tile -> visible to the consumers' wgmma (async proxy)
      mbar_arrive(&full[cv % kStages]);
    }
  }
  cp_wait<0>();
}

// ------------------------------------------------------------------------------------------------ consumers

// The thread's A fragment of k32 slice j (rows rl, rl + 8 of the stage's packed weights; d0 / d1 their LUT rows):
// {row rl k 4q..4q+3, row rl+8 same, row rl k 16+4q.., row rl+8 same}. hiw = q >> 1 picks the 32-bit word holding
// codes 4q.. (bytes 2q, 2q + 1 of the chunk) and its partner 8 bytes on; sel the halfword (q & 1).
__device__ __forceinline__ void rs_frag(uint32_t* a, const uint8_t* w, const uint32_t* lut, int rl, int j, uint32_t d0,
                                        uint32_t d1, bool hiw, uint32_t sel) {
  const uint4 c0 = *reinterpret_cast<const uint4*>(w + rs_wchunk(rl, j));
  const uint4 c1 = *reinterpret_cast<const uint4*>(w + rs_wchunk(rl + 8, j));
  const uint32_t v0 = __byte_perm(hiw ? c0.y : c0.x, hiw ? c0.w : c0.z, sel);
  const uint32_t v1 = __byte_perm(hiw ? c1.y : c1.x, hiw ? c1.w : c1.z, sel);
  const uint2 e0 = codes_to_e4m3(v0, lut[2 * d0], lut[2 * d0 + 1]);
  const uint2 e1 = codes_to_e4m3(v1, lut[2 * d1], lut[2 * d1 + 1]);
  a[0] = e0.x;
  a[1] = e1.x;
  a[2] = e0.y;
  a[3] = e1.y;
}

// kAblNoConv: rs_frag's loads and word picks, no conversion (raw packed codes as the e4m3 bytes).
__device__ __forceinline__ void rs_frag_raw(uint32_t* a, const uint8_t* w, int rl, int j, bool hiw, uint32_t sel) {
  const uint4 c0 = *reinterpret_cast<const uint4*>(w + rs_wchunk(rl, j));
  const uint4 c1 = *reinterpret_cast<const uint4*>(w + rs_wchunk(rl + 8, j));
  a[0] = __byte_perm(hiw ? c0.y : c0.x, hiw ? c0.w : c0.z, sel);
  a[1] = __byte_perm(hiw ? c1.y : c1.x, hiw ? c1.w : c1.z, sel);
  a[2] = a[0];
  a[3] = a[1];
}

// codes_to_e4m3 with the nibble masks shared by both halves (prmt uses only the low 16 selector bits: the low
// halves of m, t, m >> 16, t >> 16 are today's (w & 0x7777), (w >> 3) & 0x1111, (w >> 16) & 0x7777, (w >> 19) & 0x1111).
// (prmt through asm: with __byte_perm nvcc sees that only 16 selector bits are used and splits the masks again.)
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ uint2 codes_to_e4m3_c(uint32_t w, uint32_t lo, uint32_t hi) {
  const uint32_t m = w & 0x77777777u, t = (w >> 3) & 0x11111111u;
  uint2 r;
  r.x = prmt(lo, hi, m) | prmt(0x8000u, 0u, t);
  r.y = prmt(lo, hi, m >> 16) | prmt(0x8000u, 0u, t >> 16);
  return r;
}

// Per-byte m - s_j of a row's four scale bytes (m >= every s_j: no borrow crosses a byte).
__device__ __forceinline__ uint32_t rs_dpack(uint32_t m, uint32_t sc) { return m * 0x01010101u - sc; }

// rs_frag (same bytes) for kCheap: w4 = the stage's packed weights + 4 * hiw; dd0 / dd1 the rows' rs_dpack words.
__device__ __forceinline__ void rs_frag_c(uint32_t* a, const uint8_t* w4, const uint32_t* lut, int rl, int j,
                                          uint32_t dd0, uint32_t dd1, uint32_t sel) {
  const uint8_t* p0 = w4 + rs_wchunk(rl, j);
  const uint8_t* p1 = w4 + rs_wchunk(rl + 8, j);
  const uint32_t v0 = __byte_perm(*reinterpret_cast<const uint32_t*>(p0), *reinterpret_cast<const uint32_t*>(p0 + 8), sel);
  const uint32_t v1 = __byte_perm(*reinterpret_cast<const uint32_t*>(p1), *reinterpret_cast<const uint32_t*>(p1 + 8), sel);
  const uint32_t d0 = __byte_perm(dd0, 0u, 0x4440u | j), d1 = __byte_perm(dd1, 0u, 0x4440u | j);  // byte j
  const uint2 l0 = reinterpret_cast<const uint2*>(lut)[d0], l1 = reinterpret_cast<const uint2*>(lut)[d1];
  const uint2 e0 = codes_to_e4m3_c(v0, l0.x, l0.y);
  const uint2 e1 = codes_to_e4m3_c(v1, l1.x, l1.y);
  a[0] = e0.x;
  a[1] = e1.x;
  a[2] = e0.y;
  a[3] = e1.y;
}

// acc[i] += tmp[i] * (fa(token of i) * fw(weight row of i)): thread holds (row rl, tokens 8 j + 2 q + {0, 1}) in
// [4 j + {0, 1}] and (rl + 8, same tokens) in [4 j + {2, 3}]. The product fa * fw is cuda_wg2s4's sa * f.
__device__ __forceinline__ void rs_promote(float* acc, const float* tmp, const float* fa_s, float fw0, float fw1) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 fa = *reinterpret_cast<const float2*>(fa_s + 8 * j + 2 * q);
    acc[4 * j + 0] = fmaf(tmp[4 * j + 0], fa.x * fw0, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(tmp[4 * j + 1], fa.y * fw0, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(tmp[4 * j + 2], fa.x * fw1, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(tmp[4 * j + 3], fa.y * fw1, acc[4 * j + 3]);
  }
}

// kRelFast: acc[i] += tmp[i] * fa(token of i): one FFMA per accumulator (cuda_wg2s4r's promote_rows, transposed).
__device__ __forceinline__ void rs_promote_fa(float* acc, const float* tmp, const float* fa_s) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 fa = *reinterpret_cast<const float2*>(fa_s + 8 * j + 2 * q);
    acc[4 * j + 0] = fmaf(tmp[4 * j + 0], fa.x, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(tmp[4 * j + 1], fa.y, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(tmp[4 * j + 2], fa.x, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(tmp[4 * j + 3], fa.y, acc[4 * j + 3]);
  }
}

// The transposed tile (tokens tok0 .. tok0 + 127): acc[4 j + e] = D[token row0 + tok0 + 8 j + 2 q + (e & 1)]
// [weight row n0 + rl + 8 (e >> 1)] as bf16 (tokens past the group end and weight rows past n not stored); zeroes
// acc. kFold: each weight row's epilogue factor fe0 (row rl) / fe1 (rl + 8) first (cuda_wg2s4r's scale_cols).
template <bool kFold>
__device__ __forceinline__ void rs_store(const Params& p, const Tile& tile, float* acc, int rl, int tok0, float fe0,
                                         float fe1) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = tile.row0 + tok0 + 8 * j + 2 * q + (e & 1), nr = tile.n0 + rl + 8 * (e >> 1);
      if (tok < tile.rend && nr < p.n) {
        const float v = kFold ? acc[4 * j + e] * ((e >> 1) ? fe1 : fe0) : acc[4 * j + e];
        p.out[(size_t)tok * p.n + nr] = __nv_bfloat16_raw(__float2bfloat16_rn(v));
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
}

// cvt.rn.bf16x2.f32: {lo, hi} rounded to nearest even as __float2bfloat16_rn each (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// Four 8 x 8 b16 matrices stored transposed: lane L gives the shared address of row L % 8 of matrix L / 8 (after the
// transpose: the matrix's column L % 8), r_i holds matrix i in the mma accumulator fragment layout.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Named barrier of consumer warpgroup cw only (ids 2, 3; 0 = __syncthreads, 1 = the producer's).
__device__ __forceinline__ void consumer_wg_sync(int cw) {
  if (cw == 0) {  // (immediate ids: ptxas then reserves only the barriers used)
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 3, 128;\n" ::: "memory");
  }
}

// kEpi: rs_store's values (same bf16 bits) through the warpgroup's staging buffer buf [128 tokens][128 bytes]
// (16-byte chunk c of token t at t * 128 + ((c ^ (t % 8)) << 4); chunk c = weight rows 8 c .. 8 c + 7 of the
// consumer's 64), then 16-byte coalesced stores of whole token rows; zeroes acc. cw: the consumer warpgroup.
template <bool kFold>
__device__ __forceinline__ void rs_store_smem(const Params& p, const Tile& tile, float* acc, uint8_t* buf, int cw,
                                              int tok0, float fe0, float fe1) {
  const int tid = threadIdx.x & 127, lane = tid & 31, warp = tid >> 5, mi = lane >> 3, r = lane & 7;
  // matrix mi of step j: tokens 8 (j + mi / 2) .., weight rows 16 warp + 8 (mi % 2) .. (acc[4 j + 4 (mi / 2) +
  // 2 (mi % 2) + {0, 1}]); this lane addresses its token row 8 (mi / 2) + r (+ 8 j), chunk 2 warp + mi % 2
  const uint32_t base = smem_u32(buf) + (8 * (mi >> 1) + r) * 128 + (((2 * warp + (mi & 1)) ^ r) << 4);
  consumer_wg_sync(cw);  // every thread's reads of the previous pass are done
#pragma unroll
  for (int j = 0; j < 16; j += 2) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = kFold ? acc[4 * j + i] * ((i & 2) ? fe1 : fe0) : acc[4 * j + i];
    stmatrix_x4_trans(base + j * 8 * 128, pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                      pack_bf16x2(v[6], v[7]));
  }
  consumer_wg_sync(cw);  // the tile is staged
  const int col = tile.n0 + 64 * cw + 8 * (tid & 7);  // n % 16 == 0: a chunk is all in or all past n
#pragma unroll
  for (int it = 0; it < 8; ++it) {
    const int t = it * 16 + (tid >> 3), tok = tile.row0 + tok0 + t;
    const uint4 v = *reinterpret_cast<const uint4*>(buf + t * 128 + (((tid & 7) ^ (t & 7)) << 4));
    if (tok < tile.rend && col < p.n) *reinterpret_cast<uint4*>(p.out + (size_t)tok * p.n + col) = v;
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
}

// One k-block of a stage: fast (one tmp per token half over the four slices, promoted once) or slow (per-32
// promotion). acc: kHalves x 64 (token half h: tokens 128 h ..); the A fragments are converted once for all halves.
// kFold: returns the epilogue word (s_ref of row rl | s_ref of rl + 8 << 8 | 1 << 16 in the row-reference modes;
// one register: rs_epi_factor unpacks it at the tile's end), else 0.
template <int kStages, int kTok, bool kFold, bool kCheap, int kAblate = 0>
__device__ __forceinline__ uint32_t rs_block(float (*acc)[64], float* tmp, uint8_t* st, const uint32_t* lut, int rl,
                                             bool hiw, uint32_t sel) {
  using L = RsLayout<kStages, kTok, kFold>;
  const uint32_t* s_src = reinterpret_cast<const uint32_t*>(st + L::kS);
  const float* fa_s = reinterpret_cast<const float*>(st + L::kFa);
  const uint8_t* w = st + L::kW;
  const uint32_t x_base = smem_u32(st + L::kX);
  const uint32_t sc0 = s_src[rl], sc1 = s_src[rl + 8];
  if constexpr ((kAblate & kAblProdOnly) != 0) return 0u;  // (the consumer only waits and arrives)
  // the ablations always take the fast path
  const int mode = kAblate != 0 ? kAbsFast : *reinterpret_cast<const volatile int*>(st + L::kMode);
  const bool rel = kFold && mode >= kRelFast;  // kRelFast, kRelSlow, kRelMid
  uint32_t ref0 = 0, ref1 = 0;
  if constexpr (kFold) {
    const uint16_t* r_src = reinterpret_cast<const uint16_t*>(st + L::kR);
    ref0 = r_src[rl] & 0xffu;
    ref1 = r_src[rl + 8] & 0xffu;
  }
  uint32_t a[4][4];
  if (mode != kAbsSlow && mode != kRelSlow) {
    const bool fold = kFold && mode == kRelFast;  // codes relative to s_ref: no per-block weight factor
    const uint32_t m0 = fold ? ref0 : max4(sc0), m1 = fold ? ref1 : max4(sc1);
    // kAbsFast: 2^(s_max - 133); kRelMid: 2^(s_max - s_ref) (in [2^-kRelSpan, 1]: exact); kRelFast: unused
    const float fw0 = rel ? pow2i((int)m0 - (int)ref0) : pow2_scale(m0);
    const float fw1 = rel ? pow2i((int)m1 - (int)ref1) : pow2_scale(m1);
    const uint32_t dd0 = kCheap ? rs_dpack(m0, sc0) : 0u, dd1 = kCheap ? rs_dpack(m1, sc1) : 0u;
#pragma unroll
    for (int h = 0; h < L::kHalves; ++h) {
      const uint32_t xb = x_base + h * 128 * 128;
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // (half 0) convert slice j while the tensor core runs slice j - 1, then issue
        if (h == 0) {
          if constexpr ((kAblate & kAblNoConv) != 0) {
            rs_frag_raw(a[j], w, rl, j, hiw, sel);
          } else if constexpr (kCheap) {
            rs_frag_c(a[j], w + (hiw ? 4 : 0), lut, rl, j, dd0, dd1, sel);
          } else {
            rs_frag(a[j], w, lut, rl, j, m0 - ((sc0 >> (8 * j)) & 0xffu), m1 - ((sc1 >> (8 * j)) & 0xffu), hiw, sel);
          }
        }
        wg_arrive();
        if constexpr ((kAblate & kAblNoMma) != 0) {
          rs_fake_wgmma(tmp, a[j]);
        } else if constexpr ((kAblate & kAblNoPromo) != 0) {
          wgmma_m64n128k32_e4m3_rs(acc[h], a[j], gmma_desc(xb + 32 * j), 1);
        } else {
          wgmma_m64n128k32_e4m3_rs(tmp, a[j], gmma_desc(xb + 32 * j), j);
        }
      }
      if constexpr ((kAblate & kAblNoPromo) == 0) {
        wg_commit();
        wg_wait0();
        reg_fence<64>(tmp);
        if constexpr ((kAblate & kAblNoFfma) == 0) {
          if (fold) {
            rs_promote_fa(acc[h], tmp, fa_s + 128 * h);
          } else {
            rs_promote(acc[h], tmp, fa_s + 128 * h, fw0, fw1);
          }
        }
      }
    }
    if constexpr ((kAblate & kAblNoPromo) != 0) {  // one group for both halves (no shared tmp to drain)
      wg_commit();
      wg_wait0();
#pragma unroll
      for (int h = 0; h < L::kHalves; ++h) reg_fence<64>(acc[h]);
    }
  } else {  // adversarial scales: four k32 steps (d = 0), each promoted with its own group scale
#pragma unroll 1
    for (int j = 0; j < 4; ++j) {
      if constexpr (kCheap) {
        rs_frag_c(a[0], w + (hiw ? 4 : 0), lut, rl, j, 0u, 0u, sel);
      } else {
        rs_frag(a[0], w, lut, rl, j, 0u, 0u, hiw, sel);
      }
      const uint32_t s0 = (sc0 >> (8 * j)) & 0xffu, s1 = (sc1 >> (8 * j)) & 0xffu;
      // kRelSlow: cuda_wg2s4r's relative factors 2^(s_j - s_ref) (>= 2^-kRelSpan)
      const float fw0 = rel ? pow2i((int)s0 - (int)ref0) : pow2_scale(s0);
      const float fw1 = rel ? pow2i((int)s1 - (int)ref1) : pow2_scale(s1);
#pragma unroll
      for (int h = 0; h < L::kHalves; ++h) {
        wg_arrive();
        wgmma_m64n128k32_e4m3_rs(tmp, a[0], gmma_desc(x_base + h * 128 * 128 + 32 * j), 0);
        wg_commit();
        wg_wait0();
        reg_fence<64>(tmp);
        rs_promote(acc[h], tmp, fa_s + 128 * h, fw0, fw1);
      }
    }
  }
  return rel ? (ref0 | (ref1 << 8) | (1u << 16)) : 0u;
}

// The epilogue factor of row rl (hi = false) or rl + 8 (hi) from rs_block's word: 2^(s_ref - 133), or 1.
__device__ __forceinline__ float rs_epi_factor(uint32_t epi, bool hi) {
  return (epi >> 16) ? pow2_scale((epi >> (hi ? 8 : 0)) & 0xffu) : 1.f;
}

template <int kStages, int kTok, bool kFold, bool kCheap, int kAblate = 0, bool kEpi = false>
__device__ void rs_consumer(const Params& p, uint8_t* smem, const int* prefix, int my_tiles, int kblocks,
                            int n_tiles) {
  using L = RsLayout<kStages, kTok, kFold>;
  const int tid = threadIdx.x - 128, lane = tid & 31, cw = tid >> 7, q = lane & 3;
  const int rl = 64 * cw + 16 * ((tid >> 5) & 3) + (lane >> 2);  // the thread's first weight row in the tile
  const bool hiw = (q >> 1) != 0;
  const uint32_t sel = (q & 1) ? 0x7632u : 0x5410u;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kStages;
  const uint32_t* lut = reinterpret_cast<const uint32_t*>(smem + L::kLut);
  const int steps = my_tiles * kblocks;
  float acc[L::kHalves][64], tmp[64];
#pragma unroll
  for (int h = 0; h < L::kHalves; ++h) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[h][i] = 0.f;
  }
  int ct = 0, ckb = 0;
  Tile ctile = decode_tile<L::kBM>(blockIdx.x, prefix, p.offs, p.g, p.m, n_tiles);
  for (int sp = 0; sp < steps; ++sp) {
    const int stage = sp % kStages;
    mbar_wait(&full[stage], (uint32_t)((sp / kStages) & 1));
    // epi: the same for every block of a tile (s_ref and the bad flag are per weight row)
    const uint32_t epi =
        rs_block<kStages, kTok, kFold, kCheap, kAblate>(acc, tmp, smem + stage * L::kStage, lut, rl, hiw, sel);
    mbar_arrive(&empty[stage]);  // the wgmmas and the generic reads of this stage are done
    if (++ckb == kblocks) {
#pragma unroll
      for (int h = 0; h < L::kHalves; ++h) {
        if constexpr ((kAblate & kAblNoStore) != 0) {
          rs_sink(acc[h]);
        } else if constexpr (kEpi) {
          rs_store_smem<kFold>(p, ctile, acc[h], smem + RsLayout<kStages, kTok, kFold, true>::kEpiBuf + cw * 16384,
                               cw, 128 * h, rs_epi_factor(epi, false), rs_epi_factor(epi, true));
        } else {
          rs_store<kFold>(p, ctile, acc[h], rl, 128 * h, rs_epi_factor(epi, false), rs_epi_factor(epi, true));
        }
      }
      ckb = 0;
      ++ct;
      if (ct < my_tiles) ctile = decode_tile<L::kBM>(blockIdx.x + ct * gridDim.x, prefix, p.offs, p.g, p.m, n_tiles);
    }
  }
}

template <int kStages, int kTok, bool kFold = false, bool kCheap = false, int kAblate = 0, bool kEpi = false>
__global__ void __launch_bounds__(384, 1) w4a8_rs_kernel(const Params p) {
  using L = RsLayout<kStages, kTok, kFold>;  // (kEpi: the same offsets, staging appended)
  static_assert(!kEpi || L::kEpiBuf + L::kEpiBytes + 1024 <= 227 * 1024, "the staging buffers do not fit beside this ring");
  static_assert(!kEpi || kAblate == 0, "the fast epilogue is not an ablation build");
  static_assert(kStages >= 3, "the ring needs >= 3 stages (one loading, one ready, one consumed)");
  static_assert(kAblate == 0 || (!kFold && !kCheap), "the diagnostic ablations are built on the absolute scheme only");
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
      mbar_init(&full[s], 128);            // every producer thread arrives (each fenced its own copies)
      mbar_init(&full[kStages + s], 256);  // every consumer thread arrives
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  build_prefix<L::kBM, L::kThreads>(prefix, reinterpret_cast<int*>(smem + L::kScan), p.offs, p.g, p.m, n_tiles);
  const int total = prefix[p.g];
  const int my_tiles = total > (int)blockIdx.x ? (total - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  if (my_tiles == 0) return;
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(L::kProdRegs) : "memory");
    rs_producer<kStages, kTok, kFold>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(L::kConsRegs) : "memory");
    rs_consumer<kStages, kTok, kFold, kCheap, kAblate, kEpi>(p, smem, prefix, my_tiles, kblocks, n_tiles);
  }
}

}  // namespace dg_w4a8
