// W4A8 M-grouped GEMM on the FP8 tensor cores (sm_90a): out[r] = (a[r] * sfa[r]) @ dequant(W_i)^T for the rows r
// of group i (contiguous layout, offs = cumulative group ends). Python wrapper: backends/cuda/cuda_w4a8_grouped.py.
//
// Operands: a e4m3 [m, k] row major, sfa fp32 [m, k/128]; packed e2m1 [g, n, k/2] (low nibble = even k), E8M0
// scales [g, n, k/32]; out bf16 [m, n].
//
// Tiles: BM = 64 * kWG token rows (one m64 wgmma row block per consumer warpgroup) x BN = 128 weight rows, k walked
// in 128-deep blocks (one activation scale and four weight scales per row). Every thread of the CTA loads (cp.async,
// kStages-deep ring: the A tile, the packed weights and their scale bytes), converts and computes; no warp
// specialisation. Persistent: gridDim.x CTAs walk the flattened (tile, k-block) stream, so the ring runs across tile
// boundaries. Tile order: group, then n tile, then m tile (the m tiles of one expert sharing a weight tile run side by
// side; the whole n sweep of an expert's rows stays within ~132 CTAs, so its activations are reused from L2).
//
// Numerics (the reason for the 128-deep block): per k-block and weight row n, s_max = max of the 4 E8M0 bytes s_j.
// Each e2m1 code c of group j is stored as the e4m3 byte of c * 2^(6 - d_j), d_j = s_max - s_j. This is EXACT for
// d_j <= 14: the e2m1 magnitudes {0.5, 1, 1.5, 2, 3, 4, 6} * 2^E are e4m3 values for E in [-8, 6] (6 * 2^6 = 384 <=
// 448; 0.5 * 2^-8 = 2^-9 is the smallest e4m3 subnormal; 1.5 * 2^-8 = 3 * 2^-9 and 3 * 2^-8 = 6 * 2^-9 are
// subnormals with 3 mantissa bits). The kernel uses d_j <= 11 (kMaxShift), where every stored weight is a NORMAL e4m3
// value (0.5 * 2^-5 = 2^-6), so the result does not depend on how the tensor cores treat subnormal inputs; the cost
// is only that blocks spreading 12..14 binades take the per-32 path. The 4 k32 wgmmas of the block accumulate into a temporary and the block is
// promoted once into the fp32 accumulator: acc += tmp * sfa[r, kb] * 2^(s_max - 127 - 6). So the result equals the
// reference's fp32 dot products up to summation order (the tensor core's internal accumulation within 128 products,
// then fp32 across blocks, as DeepGEMM's FP8 GEMM). A block where some row of the tile has d_j > 11 ("slow block",
// flag shared by the CTA) is stored with d_j = 0 for every group and multiplied as four separate k32 steps, each
// promoted with its own 2^(s_j - 133): exact for any scale bytes; only adversarial scales pay for it. Byte 255
// (E8M0 NaN) gives a NaN scale, as in the reference.
//
// kRel variants ("row reference"): a pre-pass (w4a8_sref_kernel) stores per weight row s_ref = the row's largest
// scale byte over all k, and a "bad" bit when the row spans > kRelSpan binades or holds byte 255. In a tile with no
// bad row, codes are stored relative to s_ref instead of the block's s_max (d_j = s_ref - s_j <= 11 for the fast
// path), so the promotion needs no per-column factor: acc += tmp * sfa[r, kb] (one FFMA per accumulator, no shared
// loads), and the epilogue multiplies each column once by 2^(s_ref - 133). Blocks past the bound take the per-32 path
// with relative factors 2^(s_j - s_ref) >= 2^-kRelSpan (no fp32 underflow). Tiles with a bad row run as above.
#pragma once
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dg_w4a8_wgmma.cuh"

namespace dg_w4a8 {

constexpr int kBN = 128;  // weight rows (the wgmma's N) per tile
constexpr int kBK = 128;  // k per block: one activation scale, four weight scales
constexpr int kMaxGroups = 4096;  // the per-group tile prefix lives in shared memory
constexpr int kMaxShift = 11;     // fast-path bound: exact up to 14, 11 keeps every e4m3 weight normal (see above)
constexpr int kRelSpan = 100;     // kRel: rows spanning more binades over k run the absolute scheme (no underflow)

// Shared-memory layout (bytes from a 1 KiB aligned base).
template <int kWG, int kStages, bool kRel = false>
struct Layout {
  static constexpr int kBM = 64 * kWG;
  static constexpr int kThreads = 128 * kWG;
  static constexpr int kA = kBM * kBK;         // e4m3 A tile [BM, 128], 128-byte swizzle
  static constexpr int kW = kBN * kBK / 2;     // packed weights [128, 64]
  static constexpr int kS = kBN * 4;           // E8M0 bytes [128, 4]
  static constexpr int kR = kRel ? kBN * 2 : 0;  // kRel: the tile's row references (s_ref | bad << 8) [128]
  static constexpr int kStage = (kA + kW + kS + kR + 1023) / 1024 * 1024;
  static constexpr int kB = kStages * kStage;  // 2 x e4m3 B tile [128, 128], 128-byte swizzle
  static constexpr int kSw = kB + 2 * kBN * kBK;          // float [2][5][128]: per-column factors ([4]: kRel final)
  static constexpr int kLut = kSw + 2 * 5 * kBN * 4;      // uint8 [16][8]: e4m3 byte of |code| * 2^(6 - d)
  static constexpr int kFlag = kLut + 128;                // int [2]: slow-block flag per B buffer
  static constexpr int kScan = kFlag + 16;                // int [32]: scan scratch
  static constexpr int kPrefix = kScan + 128;             // int [g + 1]: tile prefix per group
  static constexpr int bytes(int g) { return kPrefix + 4 * (g + 1) + 1024; }  // + alignment slack
};

// ------------------------------------------------------------------------------------------------ PTX helpers

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// wgmma shared-memory descriptor, 128-byte swizzle: start >> 4, LBO >> 4 at bit 16, SBO >> 4 at bit 32, mode 1 at 62.
__device__ __forceinline__ uint64_t gmma_desc(uint32_t addr) {
  uint64_t d = (uint64_t)((addr & 0x3FFFF) >> 4);
  d |= (uint64_t)(16 >> 4) << 16;    // LBO: unused for K-major swizzled tiles whose k fits the 128-byte atom
  d |= (uint64_t)(1024 >> 4) << 32;  // SBO: 8 rows x 128 bytes between row groups
  d |= (uint64_t)1 << 62;
  return d;
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_arrive() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keep the compiler from moving register accesses across the wgmma waits (the hardware reads / writes them late).
template <int N>
__device__ __forceinline__ void reg_fence(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// 2^(s - 133) for an E8M0 byte s (the weight scale 2^(s - 127) times the 2^-6 folded into the e4m3 codes); fp32
// subnormal below s = 7, NaN for s = 255 (E8M0 NaN), as the reference.
__device__ __forceinline__ float pow2_scale(uint32_t s) {
  if (s == 255u) return __int_as_float(0x7fc00000);
  return s >= 7u ? __int_as_float((int)(s - 6u) << 23) : __int_as_float(1 << (s + 16u));
}

// ------------------------------------------------------------------------------------------------ tile schedule

struct Tile {
  int grp, row0, rend, n0;  // rows [row0, rend) of the tile (rend <= the group end), weight rows [n0, n0 + 128)
};

// Group i's rows [s_i, s_i + cnt_i): offs clamped to [0, m] so a bad offs never reads out of bounds.
__device__ __forceinline__ int2 group_rows(const int* offs, int i, int m) {
  const int s = i == 0 ? 0 : min(max(__ldg(offs + i - 1), 0), m);
  const int e = min(max(__ldg(offs + i), 0), m);
  return make_int2(s, max(e - s, 0));
}

// prefix[i] = tiles of groups < i (tiles of group i = ceil(cnt_i / BM) * n_tiles); prefix[g] = total. All threads.
template <int kBM, int kThreads>
__device__ void build_prefix(int* prefix, int* scratch, const int* offs, int g, int m, int n_tiles) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kWarps = kThreads / 32;
  int carry = 0;
  if (tid == 0) prefix[0] = 0;
  for (int base = 0; base < g; base += kThreads) {
    const int i = base + tid;
    int v = 0;
    if (i < g) v = (group_rows(offs, i, m).y + kBM - 1) / kBM * n_tiles;
    int incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += t;
    }
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    int before = carry, total = carry;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int s = scratch[w];
      before += w < warp ? s : 0;
      total += s;
    }
    if (i < g) prefix[i + 1] = before + incl;
    carry = total;
    __syncthreads();
  }
  __syncthreads();
}

template <int kBM>
__device__ __forceinline__ Tile decode_tile(int t, const int* prefix, const int* offs, int g, int m, int n_tiles) {
  int lo = 0, hi = g - 1;  // the last group i with prefix[i] <= t (t < prefix[g])
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= t) lo = mid; else hi = mid - 1;  // clang-format: keep
  }
  const int2 rows = group_rows(offs, lo, m);
  const int m_tiles = (rows.y + kBM - 1) / kBM;
  const int local = t - prefix[lo];
  const int nt = local / m_tiles, mt = local - nt * m_tiles;
  Tile tile;
  tile.grp = lo;
  tile.row0 = rows.x + mt * kBM;
  tile.rend = rows.x + rows.y;
  tile.n0 = nt * kBN;
  return tile;
}

// ------------------------------------------------------------------------------------------------ kernel pieces

struct Params {
  const uint8_t* a;       // e4m3 [m, k]
  const float* sfa;       // [m, k / 128]
  const uint8_t* packed;  // [g, n, k / 2]
  const uint8_t* scales;  // [g, n, k / 32]
  const int* offs;        // [g]
  __nv_bfloat16_raw* out; // [m, n]
  const uint16_t* sref;   // kRel: [g, n] s_ref | bad << 8 (w4a8_sref_kernel); else unused
  int m, n, k, g;
};

// Stage `stage` of the ring <- k-block kb of tile `tile` (A rows past the group end and weight rows past n read as
// zeros). Every thread issues its share; the caller commits.
template <int kWG, int kStages, bool kRel>
__device__ __forceinline__ void load_block(const Params& p, uint8_t* smem, int stage, const Tile& tile, int kb) {
  using L = Layout<kWG, kStages, kRel>;
  const int tid = threadIdx.x;
  uint8_t* st = smem + stage * L::kStage;
  const uint32_t a_dst = smem_u32(st), w_dst = smem_u32(st + L::kA), s_dst = smem_u32(st + L::kA + L::kW);
#pragma unroll
  for (int idx = tid; idx < L::kBM * 8; idx += L::kThreads) {
    const int r = idx >> 3, c = idx & 7, row = tile.row0 + r;
    const bool ok = row < tile.rend;
    const uint8_t* src = p.a + (size_t)(ok ? row : 0) * p.k + kb * kBK + c * 16;
    cp_async16(a_dst + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
  }
  const size_t wrow0 = (size_t)tile.grp * p.n;
#pragma unroll
  for (int idx = tid; idx < kBN * 4; idx += L::kThreads) {
    const int r = idx >> 2, c = idx & 3, nr = tile.n0 + r;
    const bool ok = nr < p.n;
    const uint8_t* src = p.packed + (wrow0 + (ok ? nr : 0)) * (size_t)(p.k / 2) + kb * (kBK / 2) + c * 16;
    cp_async16(w_dst + r * 64 + c * 16, src, ok);
  }
  for (int r = tid; r < kBN; r += L::kThreads) {
    const int nr = tile.n0 + r;
    const bool ok = nr < p.n;
    const uint8_t* src = p.scales + (wrow0 + (ok ? nr : 0)) * (size_t)(p.k / 32) + kb * 4;
    cp_async4(s_dst + r * 4, src, ok);
  }
  if constexpr (kRel) {  // 16 chunks of 8 rows (n % 16 == 0: a chunk is all in or all out)
    const uint32_t r_dst = s_dst + L::kS;
    if (tid < kBN / 8) {
      const int nr = tile.n0 + 8 * tid;
      const bool ok = nr < p.n;
      cp_async16(r_dst + 16 * tid, p.sref + wrow0 + (ok ? nr : 0), ok);
    }
  }
}

// 8 e2m1 codes (one 32-bit word, element order = nibble order) -> 8 e4m3 bytes via the 8-entry magnitude table
// (lo: codes 0..3, hi: codes 4..7) and the sign bits.
__device__ __forceinline__ uint2 codes_to_e4m3(uint32_t w, uint32_t lo, uint32_t hi) {
  uint2 r;
  r.x = __byte_perm(lo, hi, w & 0x7777u) | __byte_perm(0x8000u, 0u, (w >> 3) & 0x1111u);
  r.y = __byte_perm(lo, hi, (w >> 16) & 0x7777u) | __byte_perm(0x8000u, 0u, (w >> 19) & 0x1111u);
  return r;
}

__device__ __forceinline__ uint32_t max4(uint32_t sc) {
  return max(max(sc & 0xffu, (sc >> 8) & 0xffu), max((sc >> 16) & 0xffu, sc >> 24));
}
__device__ __forceinline__ uint32_t min4(uint32_t sc) {
  return min(min(sc & 0xffu, (sc >> 8) & 0xffu), min((sc >> 16) & 0xffu, sc >> 24));
}

// 2^e for an integer e in [-126, 127] (the kRel relative factors, e in [-kRelSpan, 0]).
__device__ __forceinline__ float pow2i(int e) { return __int_as_float((127 + e) << 23); }

// Block modes (CTA-uniform, returned by convert_block).
constexpr int kAbsFast = 0, kAbsSlow = 1, kRelFast = 2, kRelSlow = 3;

// Ring stage `stage` (packed weights + scale bytes) -> e4m3 B tile `buf` (swizzled) + promotion factors + the
// block's mode (returned, CTA-uniform). Contains CTA barriers (the flags); every thread must call it.
template <int kWG, int kStages, bool kRel>
__device__ __forceinline__ int convert_block(uint8_t* smem, int stage, int buf) {
  using L = Layout<kWG, kStages, kRel>;
  const int tid = threadIdx.x;
  const uint8_t* st = smem + stage * L::kStage;
  const uint8_t* w_src = st + L::kA;
  const uint32_t* s_src = reinterpret_cast<const uint32_t*>(st + L::kA + L::kW);
  const uint16_t* r_src = reinterpret_cast<const uint16_t*>(st + L::kA + L::kW + L::kS);  // kRel only
  bool rel = false;
  if constexpr (kRel) {
    int bad = 0;
    for (int r = tid; r < kBN; r += L::kThreads) bad |= r_src[r] >> 8;
    rel = __syncthreads_or(bad) == 0;  // a tile with a bad row runs the absolute scheme
  }
  int viol = 0;
  for (int r = tid; r < kBN; r += L::kThreads) {
    const uint32_t sc = s_src[r];
    const uint32_t ref = rel ? (uint32_t)(r_src[r] & 0xffu) : max4(sc);
    viol |= (ref - min4(sc)) > (uint32_t)kMaxShift;
  }
  const bool slow = __syncthreads_or(viol) != 0;
  uint8_t* b = smem + L::kB + buf * (kBN * kBK);
  float* sw = reinterpret_cast<float*>(smem + L::kSw) + buf * 5 * kBN;
  const uint32_t* lut = reinterpret_cast<const uint32_t*>(smem + L::kLut);
  for (int it = tid; it < 2 * kBN; it += L::kThreads) {
    const int r = it >> 1, h = it & 1;  // weight row, half (k 0..63 or 64..127: groups 2h, 2h + 1)
    const uint32_t sc = s_src[r];
    const uint32_t smax = rel ? (uint32_t)(r_src[r] & 0xffu) : max4(sc);  // the reference exponent of the row
    const uint4 q0 = *reinterpret_cast<const uint4*>(w_src + r * 64 + h * 32);
    const uint4 q1 = *reinterpret_cast<const uint4*>(w_src + r * 64 + h * 32 + 16);
#pragma unroll
    for (int gg = 0; gg < 2; ++gg) {
      const int grp = 2 * h + gg;
      const uint32_t s = (sc >> (8 * grp)) & 0xffu;
      const uint32_t d = slow ? 0u : smax - s;
      const uint32_t lo = lut[2 * d], hi = lut[2 * d + 1];
      const uint4 q = gg == 0 ? q0 : q1;  // 32 codes = elements 32 grp .. 32 grp + 31
      const uint2 e0 = codes_to_e4m3(q.x, lo, hi), e1 = codes_to_e4m3(q.y, lo, hi);
      const uint2 e2 = codes_to_e4m3(q.z, lo, hi), e3 = codes_to_e4m3(q.w, lo, hi);
      const int c0 = 2 * grp;  // 16-byte chunks 2 grp, 2 grp + 1 of the 128-byte row
      *reinterpret_cast<uint4*>(b + r * 128 + ((c0 ^ (r & 7)) << 4)) = make_uint4(e0.x, e0.y, e1.x, e1.y);
      *reinterpret_cast<uint4*>(b + r * 128 + (((c0 + 1) ^ (r & 7)) << 4)) = make_uint4(e2.x, e2.y, e3.x, e3.y);
    }
    if (h == 0) {
      if (rel) {  // relative factors for the per-32 path; [4]: the column's final factor (epilogue)
        if (slow) {
#pragma unroll
          for (int j = 0; j < 4; ++j) sw[j * kBN + r] = pow2i((int)((sc >> (8 * j)) & 0xffu) - (int)smax);
        }
        sw[4 * kBN + r] = pow2_scale(smax);
      } else if (slow) {
#pragma unroll
        for (int j = 0; j < 4; ++j) sw[j * kBN + r] = pow2_scale((sc >> (8 * j)) & 0xffu);
      } else {
        sw[r] = pow2_scale(smax);
      }
    }
  }
  return rel ? (slow ? kRelSlow : kRelFast) : (slow ? kAbsSlow : kAbsFast);
}

// acc[i] += tmp[i] * sa(row of i) * f(column of i): thread holds (r0, 8 j + 2 q + {0, 1}) in [4 j + {0, 1}] and
// (r0 + 8, same columns) in [4 j + {2, 3}].
__device__ __forceinline__ void promote(float* acc, const float* tmp, const float* colf, float sa0, float sa1) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 f = *reinterpret_cast<const float2*>(colf + 8 * j + 2 * q);
    acc[4 * j + 0] = fmaf(tmp[4 * j + 0], sa0 * f.x, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(tmp[4 * j + 1], sa0 * f.y, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(tmp[4 * j + 2], sa1 * f.x, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(tmp[4 * j + 3], sa1 * f.y, acc[4 * j + 3]);
  }
}

// kRel fast blocks: acc[i] += tmp[i] * sa(row of i) (the column factor waits for the epilogue).
__device__ __forceinline__ void promote_rows(float* acc, const float* tmp, float sa0, float sa1) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    acc[4 * j + 0] = fmaf(tmp[4 * j + 0], sa0, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(tmp[4 * j + 1], sa0, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(tmp[4 * j + 2], sa1, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(tmp[4 * j + 3], sa1, acc[4 * j + 3]);
  }
}

// kRel epilogue: acc[i] *= f(column of i).
__device__ __forceinline__ void scale_cols(float* acc, const float* colf) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 f = *reinterpret_cast<const float2*>(colf + 8 * j + 2 * q);
    acc[4 * j + 0] *= f.x;
    acc[4 * j + 1] *= f.y;
    acc[4 * j + 2] *= f.x;
    acc[4 * j + 3] *= f.y;
  }
}

__device__ __forceinline__ void store_tile(const Params& p, const Tile& tile, float* acc, int r0) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = r0 + 8 * half;
    if (row >= tile.rend) continue;
    __nv_bfloat16_raw* dst = p.out + (size_t)row * p.n;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = tile.n0 + 8 * j + 2 * q;
      if (col < p.n) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
        *reinterpret_cast<__nv_bfloat162*>(dst + col) = v;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
}

// ------------------------------------------------------------------------------------------------ the kernel

template <int kWG, int kStages, bool kRel>
__global__ void __launch_bounds__(128 * kWG, 1) w4a8_grouped_kernel(const Params p) {
  using L = Layout<kWG, kStages, kRel>;
  static_assert(kStages >= 3, "the ring needs >= 3 stages (one being computed, one converted, one loading)");
  extern __shared__ uint8_t smem_raw[];
  // Dynamic shared memory is only 16-byte aligned by contract: align to 1 KiB (the swizzle atom) by hand.
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7;
  int* prefix = reinterpret_cast<int*>(smem + L::kPrefix);
  const int n_tiles = (p.n + kBN - 1) / kBN, kblocks = p.k / kBK;

  if (tid < 120) {  // LUT[d][c] = e4m3 byte of |e2m1 code c| * 2^(6 - d), d = 0..14 (exact; 0..kMaxShift used)
    const int d = tid >> 3, c = tid & 7;  // |code c| = 0, 0.5 (c = 1), else (1 + (c & 1) / 2) * 2^((c >> 1) - 1)
    const float mag = c < 2 ? 0.5f * c : ldexpf(1.f + 0.5f * (c & 1), (c >> 1) - 1);
    smem[L::kLut + tid] = (uint8_t)__nv_cvt_float_to_fp8(ldexpf(mag, 6 - d), __NV_SATFINITE, __NV_E4M3);
  }
  build_prefix<L::kBM, L::kThreads>(prefix, reinterpret_cast<int*>(smem + L::kScan), p.offs, p.g, p.m, n_tiles);
  const int total = prefix[p.g];
  const int my_tiles = total > (int)blockIdx.x ? (total - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  const int steps = my_tiles * kblocks;  // the (tile, k-block) stream of this CTA
  if (steps == 0) return;

  // Loader cursor: stream position `lp` = (local tile lt, k-block lkb).
  int lt = 0, lkb = 0;
  Tile ltile = decode_tile<L::kBM>(blockIdx.x, prefix, p.offs, p.g, p.m, n_tiles);
  auto load_next = [&](int lp) {
    if (lp < steps) {
      load_block<kWG, kStages, kRel>(p, smem, lp % kStages, ltile, lkb);
      if (++lkb == kblocks) {
        lkb = 0;
        ++lt;
        if (lt < my_tiles) ltile = decode_tile<L::kBM>(blockIdx.x + lt * gridDim.x, prefix, p.offs, p.g, p.m, n_tiles);
      }
    }
    cp_commit();  // always: keeps the group count uniform for cp_wait
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_next(s);
  cp_wait<kStages - 2>();
  fence_async_smem();
  __syncthreads();
  int mode = convert_block<kWG, kStages, kRel>(smem, 0, 0);
  fence_async_smem();
  __syncthreads();

  float acc[64], tmp[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  int ct = 0, ckb = 0;
  Tile ctile = decode_tile<L::kBM>(blockIdx.x, prefix, p.offs, p.g, p.m, n_tiles);
  const int r_off = 64 * wg + 16 * ((tid >> 5) & 3) + (lane >> 2);  // this thread's first accumulator row
  const float* colf_base = reinterpret_cast<const float*>(smem + L::kSw);
  const int ks = p.k / kBK;

  for (int sp = 0; sp < steps; ++sp) {
    const int stage = sp % kStages, buf = sp & 1;
    const int r0 = ctile.row0 + r_off;
    const float sa0 = __ldg(p.sfa + (size_t)(r0 < ctile.rend ? r0 : 0) * ks + ckb);
    const float sa1 = __ldg(p.sfa + (size_t)(r0 + 8 < ctile.rend ? r0 + 8 : 0) * ks + ckb);
    const uint32_t a_base = smem_u32(smem + stage * L::kStage) + wg * 64 * 128;
    const uint32_t b_base = smem_u32(smem + L::kB + buf * (kBN * kBK));
    const bool slow = mode == kAbsSlow || mode == kRelSlow;
    if (!slow) {  // the whole 128-deep block into tmp, promoted once after the overlap below
      wg_arrive();
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_m64n128k32_e4m3(tmp, gmma_desc(a_base + 32 * j), gmma_desc(b_base + 32 * j), j);
      wg_commit();
    }
    load_next(sp + kStages - 1);  // into the stage consumed at sp - 1 (its wgmma and conversion are done)
    int next_mode = kAbsFast;
    if (sp + 1 < steps) {  // convert the next block while the tensor cores run
      cp_wait<kStages - 2>();
      fence_async_smem();
      __syncthreads();
      next_mode = convert_block<kWG, kStages, kRel>(smem, (sp + 1) % kStages, buf ^ 1);
      fence_async_smem();
    }
    const float* colf = colf_base + buf * 5 * kBN;
    if (!slow) {
      wg_wait0();
      reg_fence<64>(tmp);
      if (kRel && mode == kRelFast) {
        promote_rows(acc, tmp, sa0, sa1);
      } else {
        promote(acc, tmp, colf, sa0, sa1);
      }
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
    if (++ckb == kblocks) {
      if (kRel && mode >= kRelFast) scale_cols(acc, colf + 4 * kBN);  // the tile's blocks share its mode
      store_tile(p, ctile, acc, r0);
      ckb = 0;
      ++ct;
      if (ct < my_tiles) ctile = decode_tile<L::kBM>(blockIdx.x + ct * gridDim.x, prefix, p.offs, p.g, p.m, n_tiles);
    }
    __syncthreads();  // the next B buffer is written and visible; this stage may be reloaded
    mode = next_mode;
  }
  cp_wait<0>();  // no thread exits with copies in flight
}

// kRel pre-pass: sref[row] = max scale byte of the row over k | (bad << 8), bad = the row spans > kRelSpan binades
// or holds byte 255 (NaN). rows = g * n, kg = k / 32 (a multiple of 4: 4-byte loads).
static __global__ void w4a8_sref_kernel(const uint8_t* __restrict__ scales, uint16_t* __restrict__ sref, long long rows,
                                        int kg) {
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(scales + row * kg);
  uint32_t hi = 0, lo = 255;
  for (int i = 0; i < kg / 4; ++i) {
    const uint32_t w = __ldg(src + i);
    hi = max(hi, max4(w));
    lo = min(lo, min4(w));
  }
  const uint32_t bad = (hi - lo > (uint32_t)kRelSpan || hi == 255u) ? 1u : 0u;
  sref[row] = (uint16_t)(hi | (bad << 8));
}

}  // namespace dg_w4a8
