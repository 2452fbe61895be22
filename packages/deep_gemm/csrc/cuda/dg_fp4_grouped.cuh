// W4A16 M-grouped GEMM for the memory-bound regime (few tokens per expert): bf16 activations x FP4 (e2m1) weights
// with per-32 E8M0 scales, contiguous layout with cumulative group ends `offs` (deep_gemm's
// m_grouped_bf16_fp4_gemm_nt_contiguous contract). Torch-free: raw device pointers only.
//
// "Swap AB" GEMV-GEMM in the style of Marlin: the weights are the A operand of mma.sync.m16n8k16 (16 output
// features per MMA row block), the expert's tokens its N side (8 tokens per MMA). One CTA owns (expert, ROWS
// output features) and streams that slab of packed weights over k through an NS-stage cp.async pipeline that
// carries the weights, their E8M0 scales AND the activations of the expert's tokens, so nothing in the k loop
// waits on a global load. Experts with no tokens exit at once (no weight byte read); the token count of an expert
// is read from `offs` on the device (no host sync: CUDA-graph safe). More tokens than TN: the slab is streamed once
// per TN-token block.
//
// k order: a dot product does not care about the order of its terms, so the MMA's logical k index is mapped to
// physical k such that each lane's A fragments for 8 consecutive MMAs (128 k) are ONE 16-byte chunk of its weight
// row (32 e2m1 codes = exactly one scale group): lane (g = lane/4, t = lane%4) of sub-tile kk reads the chunk of
// physical k [kk*128 + 32t, +32); A register i (of 16, two codes each) feeds MMA i/2, and the B register i of the
// same MMA holds the activations of the same two physical k (from the same 64 contiguous bytes of the token row,
// four 16-byte shared loads). Every physical k in [0, 128) is used exactly once.
//
// Dequantisation of a 32-bit word q (8 codes): register R (0..3) pairs codes R and R+4 (the same nibble of bytes
// R/2 and R/2+2), which q << (12 - 4R) puts at the top of the two 16-bit lanes at once (no byte shuffles); then
// v = x & 0xF000F000 and (v + (v >> 6)) & 0x81C081C0 keep the sign at bit 15 and move the 3 magnitude bits to
// bits 8..6: the bf16x2 bits of code * 2^-126 (code 1 = 0.5 gives a bf16 subnormal, which mul.rn.bf16x2 keeps).
// Per two weights: 2 LOP3 on the integer ALU, the shift and the v + (v >> 6) as IMAD / IMAD.HI and the scale as
// HMUL2 on the FMA pipe (the integer ALU has half the FMA pipe's width on sm_90: it bounded the first version).
// The activations are paired to match with one `prmt` per B register ((a0, a4), (a1, a5), ... of 8 activations),
// shared by every weight row tile of the warp. One bf16x2 multiply by 2^(s-1) (the E8M0 scale 2^(s-127) with
// 2^126 folded in) gives code * 2^(s-127) exactly for s <= 128; larger scale bytes take a second multiply (x 2^127,
// then x 2^(s-128)) in a branch that real checkpoints never enter. Exact whenever the result is a normal bf16 (and
// for the subnormal code * 2^-127 .. 2^-126 range down to scale byte 0): scale bytes 2..252 for every code.
#pragma once

#ifndef DG_FP4_EMU
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>

namespace dg_fp4 {

constexpr int kKT = 256;                   // k per pipeline stage (two 128-k sub-tiles)
constexpr int kWRowBytes = kKT / 2;        // packed weight bytes of one row per stage
constexpr int kSRowBytes = kKT / 32;       // scale bytes of one row per stage
constexpr int kARowBytes = kKT * 2 + 16;   // bf16 activation row per stage, padded 16 B (bank spread)

template <int TN, int WARPS, int RT, int NS>
struct Fp4Cfg {
  static_assert(TN % 8 == 0 && TN >= 8 && TN <= 64, "TN: 8..64, a multiple of 8");
  static_assert(RT >= 1 && RT <= 4, "RT: 1..4 row tiles of 16 per warp");
  static_assert(NS >= 2 && NS <= 8, "NS: 2..8 stages");
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kRows = WARPS * RT * 16;
  static constexpr int kWBytes = kRows * kWRowBytes;
  static constexpr int kSBytes = kRows * kSRowBytes;
  static constexpr int kABytes = TN * kARowBytes;
  static constexpr int kStageBytes = kWBytes + kSBytes + kABytes;
  static constexpr int kSmemBytes = NS * kStageBytes;
  // Register caps that let the shared memory decide the CTAs per SM (no spills in the sm_90a build): 8 warps with
  // few tokens -> 128 registers (2 CTAs = 16 warps per SM); 64-row CTAs -> 170 (3 CTAs of ~52-69 KB).
  static constexpr int kMinBlocks = (WARPS == 8 && TN <= 16) ? 2 : (kRows == 64 ? 3 : 1);
  static_assert((kRows * 8) % kThreads == 0 && (kRows * 2) % kThreads == 0 && (TN * 32) % kThreads == 0,
                "copy items must split evenly over the threads");
  static_assert(kStageBytes % 16 == 0, "stages must stay 16-byte aligned");
};

// ---- PTX primitives. DG_FP4_EMU (tests/fp4_emu/) swaps in a CPU emulation of exactly these, so the CPU tests run
// this file's index logic (loader, swizzles, k permutation, fragments, dequant bits, epilogue) unchanged. ----
#ifndef DG_FP4_EMU
// ---- cp.async (zero-fill when pred is false: the ignore-src form reads nothing; src must still be valid) ----
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
  asm volatile(
      "{\n .reg .pred ign;\n setp.eq.u32 ign, %2, 0;\n"
      " cp.async.cg.shared.global [%0], [%1], 16, ign;\n}\n" ::"r"(dst),
      "l"(src), "r"(static_cast<uint32_t>(pred)));
}

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool pred) {
  asm volatile(
      "{\n .reg .pred ign;\n setp.eq.u32 ign, %2, 0;\n"
      " cp.async.ca.shared.global [%0], [%1], 4, ign;\n}\n" ::"r"(dst),
      "l"(src), "r"(static_cast<uint32_t>(pred)));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#define DG_FP4_DYNAMIC_SMEM(name) extern __shared__ __align__(128) uint8_t name[]

// Shared loads as plain C++ loads (not volatile asm): the compiler may schedule them early (the next row tile's
// loads under the current MMAs) but never across __syncthreads.
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  return *static_cast<const uint4*>(__cvta_shared_to_generic(addr));
}

__device__ __forceinline__ uint32_t lds8(uint32_t addr) {
  return *static_cast<const uint8_t*>(__cvta_shared_to_generic(addr));
}

// v + (v >> 6) as one IMAD.HI, hi32(v * mul) + v with mul = 2^26: the shift runs on the FMA pipe, not the integer
// ALU. `mul` comes from the kernel arguments (Fp4Args::shr6_mul): with a literal 2^26 ptxas rewrites the
// instruction into LEA.HI, an integer-ALU op.
__device__ __forceinline__ uint32_t add_shr6(uint32_t v, uint32_t mul) {
  uint32_t d;
  asm("mad.hi.u32 %0, %1, %2, %1;\n" : "=r"(d) : "r"(v), "r"(mul));
  return d;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t x, uint32_t y) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(x), "r"(y));
  return d;
}

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#endif  // DG_FP4_EMU

// Codes R and R+4 of the 8 in word q (R = 0..3: the low nibble of byte R/2 for even R, the high one for odd R, and
// the same nibble of byte R/2 + 2) -> bf16x2 bits of (code_R, code_R+4) * 2^-126. q << (12 - 4R) puts the two
// nibbles at the top of the two 16-bit lanes (a multiply: FMA pipe); two LOP3s and one IMAD.HI finish:
// (v + (v >> 6)) & 0x81C081C0 keeps the sign at bit 15 and the 3 magnitude bits at 8..6 (no carries: the two
// copies do not overlap).
template <int R>
__device__ __forceinline__ uint32_t e2m1x2_bits(uint32_t q, uint32_t shr6_mul) {
  const uint32_t v = (q * (1u << (12 - 4 * R))) & 0xF000F000u;
  return add_shr6(v, shr6_mul) & 0x81C081C0u;
}

// 16 packed bytes (32 codes, one scale group) with E8M0 scale byte s -> 16 bf16x2 registers; register 4w + R holds
// codes (8w + R, 8w + R + 4) of the chunk (`act_pairs` pairs the activations the same way).
__device__ __forceinline__ void dequant32(const uint4 w, uint32_t s, uint32_t shr6_mul, uint32_t (&out)[16]) {
  const bool big = s > 128u;  // 2^(s-1) overflows bf16: two multiplies (never for real checkpoints)
  const uint32_t m1 = big ? 0x7F007F00u : ((s + 126u) << 7) * 0x10001u;
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t q = words[i];
    out[4 * i + 0] = mul_bf16x2(e2m1x2_bits<0>(q, shr6_mul), m1);
    out[4 * i + 1] = mul_bf16x2(e2m1x2_bits<1>(q, shr6_mul), m1);
    out[4 * i + 2] = mul_bf16x2(e2m1x2_bits<2>(q, shr6_mul), m1);
    out[4 * i + 3] = mul_bf16x2(e2m1x2_bits<3>(q, shr6_mul), m1);
  }
  if (big) {
    const uint32_t m2 = ((s - 1u) << 7) * 0x10001u;  // 2^(s-128)
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = mul_bf16x2(out[i], m2);
  }
}

// Activation chunk (16 B) c of a stage row -> its position: chunks 8..15 and 24..31 swap pairs (c ^ 2) so that the
// 8 lanes of one shared-load phase (t = 0..3 of two rows) hit 8 different 16-byte bank groups.
__device__ __forceinline__ int a_swizzle(int c) { return c ^ (((c >> 3) & 1) << 1); }

// 8 activations a0..a7 (bf16, natural order in 16 bytes) -> the B registers matching `dequant32`'s pairing:
// (a0, a4), (a1, a5), (a2, a6), (a3, a7).
__device__ __forceinline__ void act_pairs(const uint4 v, uint32_t* b) {
  b[0] = __byte_perm(v.x, v.z, 0x5410);
  b[1] = __byte_perm(v.x, v.z, 0x7632);
  b[2] = __byte_perm(v.y, v.w, 0x5410);
  b[3] = __byte_perm(v.y, v.w, 0x7632);
}

struct Fp4Args {
  const __nv_bfloat16* a;  // [m, k]
  const uint8_t* packed;   // [g, n, k/2]
  const uint8_t* scales;   // [g, n, k/32]
  const int* offs;         // [g] cumulative group ends
  __nv_bfloat16* out;      // [m, n]
  int m, n, k, g;
  uint32_t shr6_mul;  // 2^26 (see add_shr6)
};

// What one thread copies per stage, fixed for a (CTA, token block): copy item i of each kind is base + i * stride
// (+ the k tile's offset); the thread's column chunk is the same for every i (the item counts are multiples of the
// chunks per row), so the k-tail test is one compare per kind and stage, and a row / token test one per item.
struct LoadPlan {
  const uint8_t* w;   // packed weights of item 0 (row r0 = tid / 8, chunk tid % 8)
  const uint8_t* s;   // scales of item 0 (row tid / 2, half tid % 2)
  const uint8_t* a;   // activations of item 0 (token tid / 32, chunk tid % 32)
  uint32_t w_stride, s_stride, a_stride;  // bytes between items
  int w_rows, s_rows, a_rows;             // items with a valid row / token
  int w_kfirst, s_kfirst, a_kfirst;       // this thread's first k in a tile (k-tail test: kbase + kfirst < k)
  uint32_t w_dst, s_dst, a_dst;           // shared offsets of item 0 inside a stage
};

template <int TN, int WARPS, int RT, int NS>
__device__ __forceinline__ LoadPlan make_plan(const Fp4Args& p, int e, int row0, int tok0, int end) {
  using C = Fp4Cfg<TN, WARPS, RT, NS>;
  constexpr int kWStep = C::kThreads / 8, kSStep = C::kThreads / 2, kAStep = C::kThreads / 32;  // rows per item
  const int tid = threadIdx.x;
  const int wr = tid >> 3, wc = tid & 7, sr = tid >> 1, sh = tid & 1, at = tid >> 5, ac = tid & 31;
  const size_t wrow = static_cast<size_t>(p.k / 2), srow = static_cast<size_t>(p.k / 32);
  const size_t erow = static_cast<size_t>(e) * p.n + row0;  // first row of the CTA's slab in [g * n]
  LoadPlan l;
  l.w = p.packed + (erow + wr) * wrow + wc * 16;
  l.s = p.scales + (erow + sr) * srow + sh * 4;
  l.a = reinterpret_cast<const uint8_t*>(p.a + static_cast<size_t>(tok0 + at) * p.k + ac * 8);
  l.w_stride = static_cast<uint32_t>(kWStep * wrow);
  l.s_stride = static_cast<uint32_t>(kSStep * srow);
  l.a_stride = static_cast<uint32_t>(kAStep * p.k * 2);
  l.w_rows = max(0, (p.n - row0 - wr + kWStep - 1) / kWStep);
  l.s_rows = max(0, (p.n - row0 - sr + kSStep - 1) / kSStep);
  l.a_rows = max(0, (end - tok0 - at + kAStep - 1) / kAStep);
  // the fallback address of a skipped copy is item 0 (tile 0): keep it inside the tensors even when it is skipped too
  if (l.w_rows == 0) l.w = p.packed;
  if (l.s_rows == 0) l.s = p.scales;
  if (l.a_rows == 0) l.a = reinterpret_cast<const uint8_t*>(p.a);
  l.w_kfirst = wc * 32;
  l.s_kfirst = sh * 128;
  l.a_kfirst = ac * 8;
  l.w_dst = wr * kWRowBytes + ((wc ^ ((wr & 1) << 2)) << 4);  // kWStep is even: every item has wr's parity
  l.s_dst = sr * kSRowBytes + sh * 4;
  l.a_dst = at * kARowBytes + (a_swizzle(ac) << 4);
  return l;
}

template <int TN, int WARPS, int RT, int NS>
__device__ __forceinline__ void load_stage(const LoadPlan& l, int k, uint32_t stage, int kt) {
  using C = Fp4Cfg<TN, WARPS, RT, NS>;
  constexpr int kWStep = C::kThreads / 8, kSStep = C::kThreads / 2, kAStep = C::kThreads / 32;
  const int kbase = kt * kKT;
  const uint32_t sw = stage, ss = stage + C::kWBytes, sa = stage + C::kWBytes + C::kSBytes;
  const bool wk = kbase + l.w_kfirst < k, sk = kbase + l.s_kfirst < k, ak = kbase + l.a_kfirst < k;
  const uint8_t* w = l.w + kbase / 2;  // (invalid items keep a valid address: cp.async reads nothing then)
  const uint8_t* s = l.s + kbase / 32;
  const uint8_t* a = l.a + kbase * 2;
#pragma unroll
  for (int i = 0; i < C::kRows * 8 / C::kThreads; ++i) {  // weights: 8 x 16 B per row
    const bool ok = wk && i < l.w_rows;
    cp_async16(sw + l.w_dst + i * kWStep * kWRowBytes, ok ? w + i * l.w_stride : l.w, ok);
  }
#pragma unroll
  for (int i = 0; i < C::kRows * 2 / C::kThreads; ++i) {  // scales: 2 x 4 B per row
    const bool ok = sk && i < l.s_rows;
    cp_async4(ss + l.s_dst + i * kSStep * kSRowBytes, ok ? s + i * l.s_stride : l.s, ok);
  }
#pragma unroll
  for (int i = 0; i < TN * 32 / C::kThreads; ++i) {  // activations: 32 x 16 B per token row
    const bool ok = ak && i < l.a_rows;
    cp_async16(sa + l.a_dst + i * kAStep * kARowBytes, ok ? a + i * l.a_stride : l.a, ok);
  }
}

template <int TN, int WARPS, int RT, int NS>
__device__ __forceinline__ void compute_stage(uint32_t stage, uint32_t shr6_mul, float (&acc)[RT][TN / 8][4]) {
  using C = Fp4Cfg<TN, WARPS, RT, NS>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const uint32_t sw = stage, ss = stage + C::kWBytes, sa = stage + C::kWBytes + C::kSBytes;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const int cidx = kk * 4 + tq;  // this lane's 16-byte chunk (scale group) of the stage's 128-byte row
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const int rlo = (warp * RT + rt) * 16 + gq, rhi = rlo + 8;  // same parity: same swizzle
      const int woff = (cidx ^ ((rlo & 1) << 2)) << 4;
      uint32_t lo[16], hi[16];
      dequant32(lds128(sw + rlo * kWRowBytes + woff), lds8(ss + rlo * kSRowBytes + cidx), shr6_mul, lo);
      dequant32(lds128(sw + rhi * kWRowBytes + woff), lds8(ss + rhi * kSRowBytes + cidx), shr6_mul, hi);
#pragma unroll
      for (int tg = 0; tg < TN / 8; ++tg) {
        const uint32_t arow = sa + (tg * 8 + gq) * kARowBytes;
        uint32_t b[16];
#pragma unroll
        for (int q = 0; q < 4; ++q) act_pairs(lds128(arow + (a_swizzle(kk * 16 + tq * 4 + q) << 4)), &b[4 * q]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          mma_bf16_16816(acc[rt][tg], lo[2 * j], hi[2 * j], lo[2 * j + 1], hi[2 * j + 1], b[2 * j], b[2 * j + 1]);
        }
      }
    }
  }
}

template <int TN, int WARPS, int RT, int NS>
__global__ void __launch_bounds__(WARPS * 32, (Fp4Cfg<TN, WARPS, RT, NS>::kMinBlocks))
    fp4_w4a16_grouped_kernel(const Fp4Args p) {
  using C = Fp4Cfg<TN, WARPS, RT, NS>;
  DG_FP4_DYNAMIC_SMEM(smem);
  const int e = blockIdx.y;
  const int row0 = blockIdx.x * C::kRows;
  int end = min(p.offs[e], p.m);
  const int start = e > 0 ? max(p.offs[e - 1], 0) : 0;
  if (start >= end || row0 >= p.n) return;  // empty expert: no weight byte is read
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int ktiles = (p.k + kKT - 1) / kKT;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gq = lane >> 2, tq = lane & 3;

  for (int tok0 = start; tok0 < end; tok0 += TN) {
    float acc[RT][TN / 8][4];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int tg = 0; tg < TN / 8; ++tg)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[rt][tg][i] = 0.f;

    const LoadPlan plan = make_plan<TN, WARPS, RT, NS>(p, e, row0, tok0, end);
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
      if (s < ktiles) load_stage<TN, WARPS, RT, NS>(plan, p.k, base + s * C::kStageBytes, s);
      cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
      cp_async_wait<NS - 2>();
      __syncthreads();  // stage kt landed for every thread; stage kt-1 is free for the next load
      const int next = kt + NS - 1;
      if (next < ktiles) load_stage<TN, WARPS, RT, NS>(plan, p.k, base + (next % NS) * C::kStageBytes, next);
      cp_async_commit();
      compute_stage<TN, WARPS, RT, NS>(base + (kt % NS) * C::kStageBytes, p.shr6_mul, acc);
    }
    cp_async_wait<0>();
    __syncthreads();  // every stage is free before the next token block refills them

    // D fragment: (row g | g+8, tokens 2t, 2t+1) of each (row tile, token group)
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
            p.out[static_cast<size_t>(tok) * p.n + row] = __float2bfloat16_rn(acc[rt][tg][i]);
          }
        }
      }
    }
  }
}

}  // namespace dg_fp4
