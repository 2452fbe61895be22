// deep_select radix top-k: the device code (see topk_radix.cu for the algorithm, bytes and occupancy).
//
// Included by topk_radix.cu (CUDA) and by the CPU emulation in tests/cuda_emu/ (which maps __syncthreads, warp
// shuffles / votes, shared-memory atomics and cub::BlockScan onto std::thread barriers so the CPU tests run this
// exact code). The includer provides <cstdint>, cub::BlockScan, the CUDA intrinsics, DS_DYNAMIC_SMEM(name) and
// "topk_radix.cuh" (DType).
#pragma once

namespace deep_select {
namespace detail {

#ifndef DS_THREADS
#define DS_THREADS 512  // the CPU emulation may build with fewer threads (faster tests, same code)
#endif
constexpr int kThreads = DS_THREADS;
constexpr int kBins = 4096;  // up to 12-bit digits
// The first digit is u's top 12 bits (sign, 8 exponent bits, 3 mantissa bits: buckets 1/8 of an octave wide),
// so few entries share the threshold's bucket; then 10 + 10 bits of u, then the column in <= 11-bit digits.
constexpr int kTopShift = 20;       // first digit = u >> kTopShift
constexpr int kTopKeyShift = 52;    // ... = K >> kTopKeyShift
constexpr int kBinsPerThread = kBins / kThreads;
static_assert(kThreads % 32 == 0 && kBins % kThreads == 0, "whole warps, whole bins per thread");
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread per iteration
constexpr int kULevels = 3;  // digits of u: [31:20], [19:10], [9:0]
constexpr unsigned kFull = 0xffffffffu;
// Kernel modes (the MODE template argument; codes shared with topk_radix.cuh's launcher and the Python side).
constexpr int kModeTwoPass = 0;  // histogram pass, then a collecting second pass
constexpr int kModeOneRead = 1;  // round-1 one-read pass: histogram every entry, keep after a per-tile choose
constexpr int kModeFast = 2;     // filtered one-read pass with a prefetched tile (stream_pass_fast)
constexpr int kModeLean = 3;     // fast, with a 1-2 instruction per-element filter (stream_pass_lean)
constexpr int kModeLeanPf = 4;   // lean + bulk L2 prefetch of the tiles kPrefetchTiles ahead
constexpr int kPrefetchTiles = 2;

using BlockScan = cub::BlockScan<int, kThreads>;

struct Shared {
  int hist[kBins];
  typename BlockScan::TempStorage scan;
  int out_count;   // output slots used so far
  int cand_count;  // candidates kept
  int sel_digit, sel_above, sel_cnt;
};

// Gather rows (the split's merge kernel): DT | kGather streams int32 column ids (4-byte loads, -1 = none) and
// gathers the DT value of each id from the source row (visit_tile).
constexpr int kGather = 16;
template <int DT>
struct Traits {  // only DT | kGather uses the primary template
  static_assert((DT & kGather) != 0, "unknown dtype code");
  static constexpr int kBytes = 4;  // the ids
};
template <>
struct Traits<kFloat32> {
  static constexpr int kBytes = 4;
  static constexpr uint32_t kInf = 0x7F800000u;
};
template <>
struct Traits<kBFloat16> {
  static constexpr int kBytes = 2;
  static constexpr uint32_t kInf = 0x7F800000u;
};
template <>
struct Traits<kFloat16> {
  static constexpr int kBytes = 2;
  static constexpr uint32_t kInf = 0x7C000000u;  // fp16 bits in the high half keep their own (ordered) layout
};

// Raw bits (16-bit types in the low half) -> u, the unsigned rank image: the Triton kernels' int32 key
// (sign-magnitude -> two's complement, -0.0 -> 0, NaN -> -0x7F800001 just below -inf) with its sign flipped.
template <int DT>
__device__ __forceinline__ uint32_t rank_u(uint32_t raw) {
  static_assert((DT & kGather) == 0, "rank_u takes the value's dtype");
  const uint32_t bits = Traits<DT>::kBytes == 4 ? raw : (raw << 16);
  const uint32_t mag = bits & 0x7FFFFFFFu;
  int32_t key = (bits >> 31) ? -static_cast<int32_t>(mag) : static_cast<int32_t>(bits);
  key = mag > Traits<DT>::kInf ? -0x7F800001 : key;
  return static_cast<uint32_t>(key) ^ 0x80000000u;
}

struct Level {
  int shift, width;
};

// Digit `li` of K (see header comment): three digits of u, then the nb column bits.
__device__ __forceinline__ Level level_of(int li, int nb) {
  if (li < kULevels) return li == 0 ? Level{kTopKeyShift, 12} : (li == 1 ? Level{42, 10} : Level{32, 10});
  const int rem = nb - 11 * (li - kULevels);
  const int w = rem < 11 ? rem : 11;
  return Level{rem - w, w};
}

__device__ __forceinline__ int num_levels(int nb) { return kULevels + (nb + 10) / 11; }

__device__ __forceinline__ uint64_t make_key(uint32_t u, int col, uint32_t cmax) {
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint64_t>(cmax - static_cast<uint32_t>(col));
}

// Adds one to hist[bin] per lane with bin >= 0. Warp-uniform bins (all-equal rows, ties) take one atomic.
__device__ __forceinline__ void hist_add(int* hist, int bin) {
  const int b0 = __shfl_sync(kFull, bin, 0);
  if (__all_sync(kFull, bin == b0)) {
    if ((threadIdx.x & 31) == 0 && b0 >= 0) atomicAdd(&hist[b0], 32);
  } else if (bin >= 0) {
    atomicAdd(&hist[bin], 1);
  }
}

// Warp-aggregated slot reservation on a shared counter: returns this lane's slot when `take`, else -1.
__device__ __forceinline__ int reserve(int* counter, bool take) {
  const unsigned m = __ballot_sync(kFull, take);
  if (m == 0) return -1;
  const int lane = threadIdx.x & 31;
  const int leader = __ffs(m) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(m));
  base = __shfl_sync(kFull, base, leader);
  return take ? base + __popc(m & ((1u << lane) - 1u)) : -1;
}

// Loads tile `it` (UNROLL loads of kThreads x 16 B, or scalars) of the row into registers; past v1: zeros.
template <int DT, bool VEC, int UNROLL>
__device__ __forceinline__ void load_tile(uint32_t (&w)[UNROLL][4], const void* row, int64_t it, int64_t v1) {
#pragma unroll
  for (int j = 0; j < UNROLL; ++j) {
    const int64_t v = it + j * kThreads + threadIdx.x;
    if (v < v1) {
      if constexpr (VEC) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(row) + v);
        w[j][0] = q.x, w[j][1] = q.y, w[j][2] = q.z, w[j][3] = q.w;
      } else if constexpr (Traits<DT>::kBytes == 4) {
        w[j][0] = __ldg(reinterpret_cast<const unsigned int*>(row) + v);
      } else {
        w[j][0] = __ldg(reinterpret_cast<const unsigned short*>(row) + v);
      }
    } else {
      w[j][0] = w[j][1] = w[j][2] = w[j][3] = 0;
    }
  }
}

// fn(u, col, valid) for every element of a loaded tile (col relative to lo; valid: inside [0, len)).
template <int DT, bool VEC, int UNROLL, class F>
__device__ __forceinline__ void visit_tile(const uint32_t (&w)[UNROLL][4], int64_t it, int64_t v1, int64_t lo,
                                           int len, const void* gsrc, F&& fn) {
  constexpr int kPer = VEC ? 16 / Traits<DT>::kBytes : 1;  // elements per load
#pragma unroll
  for (int j = 0; j < UNROLL; ++j) {
    const int64_t v = it + j * kThreads + threadIdx.x;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t col = v * kPer + e - lo;
      const bool valid = v < v1 && col >= 0 && col < len;
      uint32_t raw;
      if constexpr (Traits<DT>::kBytes == 4) {
        raw = w[j][e];
      } else {
        raw = (w[j][e >> 1] >> ((e & 1) * 16)) & 0xFFFFu;  // little endian: element 0 in the low half
      }
      if constexpr ((DT & kGather) != 0) {  // raw is a column id of gsrc (or -1): gather its value (L2 / L1)
        constexpr int kBase = DT & ~kGather;
        const int id = static_cast<int>(raw);
        const bool ok = valid && id >= 0;
        uint32_t val = 0;
        if (ok) {
          if constexpr (Traits<kBase>::kBytes == 4) {
            val = __ldg(static_cast<const unsigned int*>(gsrc) + id);
          } else {
            val = __ldg(static_cast<const unsigned short*>(gsrc) + id);
          }
        }
        fn(rank_u<kBase>(val), id, ok);
      } else {
        fn(rank_u<DT>(raw), static_cast<int>(col), valid);
      }
    }
  }
}

// Streams the row's columns [0, len) (absolute elements lo .. lo + len of the row) one tile (kThreads x kUnroll
// loads) at a time: f(u, col, valid) for every element of the tile, then between() (block-uniform; may sync;
// returns whether to visit the tile again), then g(u, col, valid) over the same registers (no second load).
// All lanes call f / g in lockstep (the loops are block-uniform), so they may use warp collectives.
template <int DT, bool VEC, int UNROLL, class F, class B, class G>
__device__ __forceinline__ void for_each_tile(const void* row, int64_t lo, int len, const void* gsrc, F&& f,
                                              B&& between, G&& g) {
  constexpr int kPer = VEC ? 16 / Traits<DT>::kBytes : 1;  // elements per load
  const int64_t v0 = lo / kPer, v1 = (lo + len + kPer - 1) / kPer;
  for (int64_t it = v0; it < v1; it += static_cast<int64_t>(kThreads) * UNROLL) {
    uint32_t w[UNROLL][4];
    load_tile<DT, VEC, UNROLL>(w, row, it, v1);
    visit_tile<DT, VEC, UNROLL>(w, it, v1, lo, len, gsrc, f);
    if (between()) visit_tile<DT, VEC, UNROLL>(w, it, v1, lo, len, gsrc, g);
  }
}

// One visit per tile like for_each_tile, but the next tile's loads are issued before the current tile is visited
// (register double buffer), so the loads stay in flight across the visit and between(t) (t = tile number,
// block-uniform; may sync) instead of the memory pipe draining at every block-wide sync. No second visit: one
// inside the pipelined loop keeps both buffers live across it and spilled (46-124 B / thread, ptxas sm_90a).
template <int DT, bool VEC, int UNROLL, class F, class B>
__device__ __forceinline__ void for_each_tile_prefetch(const void* row, int64_t lo, int len, const void* gsrc, F&& f,
                                                       B&& between) {
  constexpr int kPer = VEC ? 16 / Traits<DT>::kBytes : 1;
  constexpr int64_t kStep = static_cast<int64_t>(kThreads) * UNROLL;
  const int64_t v0 = lo / kPer, v1 = (lo + len + kPer - 1) / kPer;
  uint32_t cur[UNROLL][4], nxt[UNROLL][4];
  load_tile<DT, VEC, UNROLL>(cur, row, v0, v1);
  int t = 0;
  for (int64_t it = v0; it < v1; it += kStep, ++t) {
    load_tile<DT, VEC, UNROLL>(nxt, row, it + kStep, v1);  // past the row: no load, zeros
    visit_tile<DT, VEC, UNROLL>(cur, it, v1, lo, len, gsrc, f);
    between(t);
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) cur[j][e] = nxt[j][e];
    }
  }
}

// One visit per element of the row (see for_each_tile).
template <int DT, bool VEC, class F>
__device__ __forceinline__ void for_each_entry(const void* row, int64_t lo, int len, const void* gsrc, F&& f) {
  for_each_tile<DT, VEC, kUnroll>(row, lo, len, gsrc, f, [] { return false; }, [](uint32_t, int, bool) {});
}

__device__ void zero_hist(Shared& s) {
  for (int i = threadIdx.x; i < kBins; i += kThreads) s.hist[i] = 0;
}

// After a histogram: the bucket holding the need-th best matching entry. Sets s.sel_* (block-wide); the caller
// syncs before and after. Bins are scanned from the top: thread t owns bins 2047 - 4t .. 2044 - 4t.
__device__ void choose(Shared& s, int need) {
  int h[kBinsPerThread], sum = 0;
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    h[i] = s.hist[kBins - 1 - (threadIdx.x * kBinsPerThread + i)];
    sum += h[i];
  }
  int before;
  BlockScan(s.scan).ExclusiveSum(sum, before);
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    if (before < need && before + h[i] >= need) {
      s.sel_digit = kBins - 1 - (threadIdx.x * kBinsPerThread + i);
      s.sel_above = before;
      s.sel_cnt = h[i];
    }
    before += h[i];
  }
  // Fewer than `need` entries counted (the stream pass's early tiles): bucket 0, i.e. keep everything. `before`
  // is now the total on every thread; the owner of bin 0 writes, so exactly one thread writes in every case.
  if (threadIdx.x == kThreads - 1 && before < need) s.sel_digit = 0, s.sel_above = before, s.sel_cnt = 0;
}

// Selection state of one row: the key prefix chosen so far and how many of its bucket are still wanted.
struct State {
  uint64_t prefix;
  int need, cnt, li;
};

// Folds the bucket `choose` picked into the state.
__device__ __forceinline__ void take_choice(Shared& s, State& st, Level lv) {
  st.prefix |= static_cast<uint64_t>(s.sel_digit) << lv.shift;
  st.need -= s.sel_above;
  st.cnt = s.sel_cnt;
}

__device__ __forceinline__ void put(int* out, int64_t stride_ok, int slot, int id) {
  out[static_cast<int64_t>(slot) * stride_ok] = id;
}

// In-place compaction of the candidates [0, m) by K >> shift against p: above p -> the output when `emit`
// (else kept), equal -> kept (or the output when take_all), below -> dropped. The caller zeroed s.cand_count and
// synced; ends with a sync, after which s.cand_count is the kept count. One chunk at a time: every slot written
// lies below the chunk's end, and the whole chunk is in registers before anyone writes.
__device__ void compact(Shared& s, uint32_t* cu, int* cc, int m, int shift, uint64_t p, bool emit, bool take_all,
                        uint32_t cmax, int* out, int64_t stride_ok, int col_off) {
  for (int base = 0; base < m; base += kThreads) {
    const int i = base + threadIdx.x;
    uint32_t u = 0;
    int c = 0;
    if (i < m) u = cu[i], c = cc[i];
    __syncthreads();
    const uint64_t key = make_key(u, c, cmax) >> shift;
    const bool live = i < m;
    const bool to_out = emit && live && (key > p || (take_all && key == p));
    const bool keep = live && !to_out && (key == p || (!emit && key > p));
    const int o = reserve(&s.out_count, to_out);
    if (o >= 0) put(out, stride_ok, o, c + col_off);
    const int slot = reserve(&s.cand_count, keep);
    if (slot >= 0) cu[slot] = u, cc[slot] = c;
  }
  __syncthreads();
}

// The one-read first digit: one pass over the row histograms u >> kTopShift and, tile by tile, keeps in shared memory
// every entry that can still be in the top kk: after each tile, bmin = the bucket of the kk-th best entry seen so
// far (0 while fewer were seen) is a lower bound of the final bucket, so entries below it are never needed and
// entries at or above it are kept (from the registers the histogram just used: no second load). When the buffer
// passes half full it is pruned to the current bmin. Normal rows keep ~kk x (1 + ln(n / tile)) entries plus the
// bucket's neighbours; ascending rows or heavy ties overflow `cap`: returns false then (the histogram is still
// complete, so the caller goes on with the two-pass path). *m_out: entries kept. Caller zeroed hist and
// cand_count and synced.
template <int DT, bool VEC>
__device__ bool stream_pass(Shared& s, const void* row, int64_t lo, int len, const void* gsrc, int kk, uint32_t* cu,
                            int* cc, int cap, uint32_t cmax, int* m_out) {
  int bmin = 0;
  bool overflow = false;
  auto hist = [&](uint32_t u, int, bool valid) { hist_add(s.hist, valid ? static_cast<int>(u >> kTopShift) : -1); };
  auto between = [&]() {
    __syncthreads();  // the tile's histogram and the previous tile's kept entries are complete
    if (overflow) return false;
    const int c = s.cand_count;  // read before the next sync: nobody adds to it until `keep` runs
    choose(s, kk);
    __syncthreads();
    bmin = s.sel_digit;
    if (c > cap) {
      overflow = true;
    } else if (2 * c > cap) {
      __syncthreads();  // everyone has read cand_count
      if (threadIdx.x == 0) s.cand_count = 0;
      __syncthreads();
      compact(s, cu, cc, c, kTopKeyShift, static_cast<uint64_t>(bmin), false, false, cmax, nullptr, 0, 0);
    }
    return !overflow;
  };
  auto keep = [&](uint32_t u, int col, bool valid) {
    const int slot = reserve(&s.cand_count, valid && static_cast<int>(u >> kTopShift) >= bmin);
    if (slot >= 0 && slot < cap) cu[slot] = u, cc[slot] = col;
  };
  // The tile stays in registers across `between`: 16-bit tiles (8 values per load) use half the loads to stay
  // within the 64 registers of 2 CTAs per SM.
  constexpr int kStreamUnroll = Traits<DT>::kBytes == 2 ? 2 : kUnroll;
  for_each_tile<DT, VEC, kStreamUnroll>(row, lo, len, gsrc, hist, between, keep);
  __syncthreads();
  *m_out = s.cand_count;
  return !overflow && *m_out <= cap;
}

// The fast one-read first digit (kModeFast). Same result contract as stream_pass, cheaper per element:
// * filtered histogram: an entry below bmin (the bucket of the kk-th best entry counted so far) can never be in
//   or above the final bucket, so it is neither counted nor kept. Invariant: hist is exact for every bin >= bmin
//   (bmin only grows, and every entry at or above the bmin of its time was counted), so each choose lands at or
//   above the previous bmin and the final choose (B, count above B, count of B) is exact. After the first tiles
//   almost every entry fails the filter: a compare and one warp vote, no shared atomic (round 1 paid an atomic
//   per element, serialised on the ~60 bins that hold a normal row's values).
// * one visit per tile: an entry is counted and kept in the same step, against the bmin of the last refresh.
//   Tile 0 (bmin = 0) is kept whole: a tile is 8,192 entries (fp32: 4 x 16-byte loads per thread; 16-bit: 2),
//   which fits the default 8,192-slot buffer (and cap = n when the row is shorter); the refresh after it prunes
//   the buffer. A smaller cap overflows and takes the two-pass fallback (correct, slower: tests only).
// * bmin is refreshed (a block scan of the 4096 bins and 3 syncs) after tiles 0-3, then after every 4th tile.
// * the next tile's loads are in flight during the visit and the refresh (for_each_tile_prefetch). In flight
//   per CTA: 32 KB (fp32) / 16 KB (16-bit); 2 CTAs per SM. (Visiting tile 0 twice, counting then keeping,
//   spilled registers: 46-124 B / thread.)
template <int DT, bool VEC>
__device__ bool stream_pass_fast(Shared& s, const void* row, int64_t lo, int len, const void* gsrc, int kk,
                                 uint32_t* cu, int* cc, int cap, uint32_t cmax, int* m_out) {
  int bmin = 0;
  bool overflow = false;  // block-uniform: the buffer overflowed (the histogram goes on)
  auto visit = [&](uint32_t u, int col, bool valid) {
    const int bucket = static_cast<int>(u >> kTopShift);
    const bool pass = valid && bucket >= bmin;
    if (__ballot_sync(kFull, pass) == 0) return;  // warp-uniform: the common case after the first tiles
    hist_add(s.hist, pass ? bucket : -1);
    if (!overflow) {
      const int slot = reserve(&s.cand_count, pass);
      if (slot >= 0 && slot < cap) cu[slot] = u, cc[slot] = col;
    }
  };
  auto between = [&](int t) {
    if (t >= 4 && (t & 3) != 3) return;  // block-uniform
    __syncthreads();  // the tiles' histogram counts and kept entries are complete
    const int c = s.cand_count;  // read before the next sync: nobody adds to it until the next visit
    choose(s, kk);
    __syncthreads();
    bmin = s.sel_digit;
    if (overflow) return;
    if (c > cap) {
      overflow = true;
    } else if (2 * c > cap) {
      __syncthreads();  // everyone has read cand_count
      if (threadIdx.x == 0) s.cand_count = 0;
      __syncthreads();
      compact(s, cu, cc, c, kTopKeyShift, static_cast<uint64_t>(bmin), false, false, cmax, nullptr, 0, 0);
    }
  };
  constexpr int kFastUnroll = Traits<DT>::kBytes == 2 ? 2 : kUnroll;  // 8,192 entries per tile
  for_each_tile_prefetch<DT, VEC, kFastUnroll>(row, lo, len, gsrc, visit, between);
  __syncthreads();
  *m_out = s.cand_count;
  return !overflow && *m_out <= cap;
}

// ---- kModeLean (round 3): the fast pass with a cheaper per-element filter ----
// Session 3's fast pass costs ~20 SASS instructions per entry that fails the filter (int64 validity math, the
// rank image, a warp vote) and ~60 per warp-slot where some lane passes (warp-aggregated atomics), and tile 0 is
// kept whole (8,192 reserves) then compacted. At ~2 TB/s that is the SMs' issue rate, not HBM. Lean mode:
// * tile 0 is counted (histogram only), bmin refreshed, then the same registers are visited again keeping only
//   entries at or above bmin: no 8,192-entry keep + compaction.
// * tiles after that: an entry passes when its value >= thr_f, the float whose rank is bmin's lower bound (one
//   FSETP for fp32, a shift + FSETP for bf16; fp16 and thresholds at or below -inf compare rank images instead);
//   tiles wholly inside [lo, lo + len) skip the validity math. Only passing lanes (~1-2 % of entries once bmin
//   settles) run the slow body: the rank image, one shared atomic on the bin, one on the candidate counter, two
//   stores. No warp collectives there, so divergence is fine.
// * 4 loads per thread per tile for every dtype (16-bit rows: 16,384 entries, 32 KB per tile in flight).
// Same invariants as stream_pass_fast (hist exact on every bin >= bmin; every entry at or above the bmin of its
// visit is kept unless the buffer overflowed), so the same resolve follows. Float compares need IEEE denormals
// (nvcc's default -ftz=false; the GPU tests' denormal rows would catch a fast-math build).

// Rank lower bound of bucket bmin as a float threshold, when a float compare is exact (see stream_pass_lean).
struct LeanThr {
  uint32_t u;  // bmin << kTopShift: pass <=> rank_u >= u
  float f;     // pass <=> value >= f (when use_f)
  bool use_f;
};

template <int DT>
__device__ __forceinline__ LeanThr lean_threshold(int bmin) {
  LeanThr t;
  t.u = static_cast<uint32_t>(bmin) << kTopShift;
  const int32_t key = static_cast<int32_t>(t.u ^ 0x80000000u);  // the rank key of the bound (see rank_u)
  // key >= 0: the bits of a non-negative float; key < 0: -key is a magnitude, the float -mag. Below -inf (mag >
  // inf bits) the bound would be a NaN pattern: rank compare then. fp16's bits are not fp32's: rank compare.
  const uint32_t bits = key >= 0 ? static_cast<uint32_t>(key) : (0x80000000u | static_cast<uint32_t>(-key));
  t.use_f = DT != kFloat16 && key >= -0x7F800000 && key <= 0x7F800000;
  t.f = __uint_as_float(t.use_f ? bits : 0u);
  return t;
}

// Element e of load j of a tile as a float (fp32 / bf16 only; 16-bit values: element 0 in the low half).
template <int DT, int UNROLL>
__device__ __forceinline__ float lean_value(const uint32_t (&w)[UNROLL][4], int j, int e) {
  if constexpr (Traits<DT>::kBytes == 4) {
    return __uint_as_float(w[j][e]);
  } else {
    const uint32_t x = w[j][e >> 1];
    return __uint_as_float((e & 1) ? (x & 0xFFFF0000u) : (x << 16));
  }
}

template <int DT, int UNROLL>
__device__ __forceinline__ uint32_t lean_raw(const uint32_t (&w)[UNROLL][4], int j, int e) {
  if constexpr (Traits<DT>::kBytes == 4) {
    return w[j][e];
  } else {
    return (w[j][e >> 1] >> ((e & 1) * 16)) & 0xFFFFu;
  }
}

// Loads tile `it` like load_tile, with 32-bit vector indices (lean mode: fewer live registers; rows < 2^31).
template <int DT, bool VEC, int UNROLL>
__device__ __forceinline__ void lean_load(uint32_t (&w)[UNROLL][4], const void* row, uint32_t it, uint32_t v1) {
#pragma unroll
  for (int j = 0; j < UNROLL; ++j) {
    const uint32_t v = it + j * kThreads + threadIdx.x;
    if (v < v1) {
      if constexpr (VEC) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(row) + v);
        w[j][0] = q.x, w[j][1] = q.y, w[j][2] = q.z, w[j][3] = q.w;
      } else if constexpr (Traits<DT>::kBytes == 4) {
        w[j][0] = __ldg(reinterpret_cast<const unsigned int*>(row) + v);
      } else {
        w[j][0] = __ldg(reinterpret_cast<const unsigned short*>(row) + v);
      }
    } else {
      w[j][0] = w[j][1] = w[j][2] = w[j][3] = 0;
    }
  }
}

// One visit of a loaded tile: every valid entry that passes thr is counted (COUNT) and kept (unless overflowed).
// USE_F: float compare; CHECKED: the tile crosses [lo, lo + len) or the row end, so validity is tested. Column
// math in uint32: an element before lo wraps to a huge col and fails col < len (rows < 2^31 - 16 elements).
template <int DT, bool VEC, int UNROLL, bool COUNT, bool USE_F, bool CHECKED>
__device__ __forceinline__ void lean_tile(Shared& s, const uint32_t (&w)[UNROLL][4], uint32_t it, uint32_t lo,
                                          uint32_t len, LeanThr thr, bool overflow, uint32_t* cu, int cap) {
  constexpr int kPer = VEC ? 16 / Traits<DT>::kBytes : 1;
#pragma unroll
  for (int j = 0; j < UNROLL; ++j) {
    const uint32_t v = it + j * kThreads + threadIdx.x;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      bool pass;
      if constexpr (USE_F) {
        pass = lean_value<DT, UNROLL>(w, j, e) >= thr.f;
      } else {
        pass = rank_u<DT>(lean_raw<DT, UNROLL>(w, j, e)) >= thr.u;
      }
      if constexpr (CHECKED) pass = pass && v * kPer + e - lo < len;  // also false past the row (v >= v1)
      if (pass) {  // rare once bmin settles: per-lane atomics, no warp collectives
        const uint32_t u = rank_u<DT>(lean_raw<DT, UNROLL>(w, j, e));
        if constexpr (COUNT) atomicAdd(&s.hist[u >> kTopShift], 1);
        if (!overflow) {
          const int slot = atomicAdd(&s.cand_count, 1);
          if (slot < cap) cu[slot] = u, cu[cap + slot] = v * kPer + e - lo;  // cc = cu + cap
        }
      }
    }
  }
}

// Picks the lean_tile variant for tile `it` (block-uniform choices).
template <int DT, bool VEC, int UNROLL>
__device__ __forceinline__ void lean_visit(Shared& s, const uint32_t (&w)[UNROLL][4], uint32_t it, uint32_t v1,
                                           uint32_t lo, uint32_t len, LeanThr thr, bool overflow, uint32_t* cu,
                                           int cap) {
  constexpr int kPer = VEC ? 16 / Traits<DT>::kBytes : 1;
  constexpr uint32_t kStep = static_cast<uint32_t>(kThreads) * UNROLL;
  const bool inside = it * kPer >= lo && it + kStep <= v1 && (it + kStep) * kPer <= lo + len;
  if (thr.use_f) {
    if (inside) {
      lean_tile<DT, VEC, UNROLL, true, true, false>(s, w, it, lo, len, thr, overflow, cu, cap);
    } else {
      lean_tile<DT, VEC, UNROLL, true, true, true>(s, w, it, lo, len, thr, overflow, cu, cap);
    }
  } else {
    lean_tile<DT, VEC, UNROLL, true, false, true>(s, w, it, lo, len, thr, overflow, cu, cap);
  }
}

// Bulk L2 prefetch (sm_90 cp.async.bulk.prefetch.L2, a hint: no registers, no completion) of tile `it`'s 16-byte
// vectors [it, it + step) clamped to the row: lanes 0-3 of warp 0, a quarter each. Raises the bytes in flight per
// SM beyond the register double buffer (32 KB per CTA) without registers: the loads of that tile then hit L2.
// 16-byte loads only (aligned rows). A no-op in the CPU emulation.
template <bool VEC>
__device__ __forceinline__ void prefetch_tile_l2(const void* row, uint32_t it, uint32_t v1, uint32_t step) {
  if constexpr (VEC) {
    if (threadIdx.x < 4 && it < v1) {
      const uint32_t q = step / 4, a = it + threadIdx.x * q;
      const uint32_t b = min(a + q, v1);
      if (a < b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        const uint4* p = reinterpret_cast<const uint4*>(row) + a;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"((b - a) * 16u) : "memory");
#endif
      }
    }
  }
}

template <int DT, bool VEC, bool PF = false>
__device__ bool stream_pass_lean(Shared& s, const void* row, int64_t lo64, int len, int kk, uint32_t* cu, int* cc,
                                 int cap, uint32_t cmax, int* m_out) {
  static_assert((DT & kGather) == 0, "lean mode streams values, not gather ids");
  constexpr int kPer = VEC ? 16 / Traits<DT>::kBytes : 1;
  constexpr int U = kUnroll;
  constexpr uint32_t kStep = static_cast<uint32_t>(kThreads) * U;
  const uint32_t lo = static_cast<uint32_t>(lo64), ulen = static_cast<uint32_t>(len);
  const uint32_t v0 = lo / kPer, v1 = (lo + ulen + kPer - 1) / kPer;
  int bmin = 0;
  bool overflow = false;  // block-uniform
  LeanThr thr = lean_threshold<DT>(0);
  auto refresh = [&]() {  // block-uniform: the bucket of the kk-th best counted entry, pruning when half full
    __syncthreads();      // the tiles' histogram counts and kept entries are complete
    const int c = s.cand_count;
    choose(s, kk);
    __syncthreads();
    bmin = s.sel_digit;
    thr = lean_threshold<DT>(bmin);
    if (overflow) return;
    if (c > cap) {
      overflow = true;
    } else if (2 * c > cap) {
      __syncthreads();  // everyone has read cand_count
      if (threadIdx.x == 0) s.cand_count = 0;
      __syncthreads();
      compact(s, cu, cc, c, kTopKeyShift, static_cast<uint64_t>(bmin), false, false, cmax, nullptr, 0, 0);
    }
  };
  uint32_t cur[U][4], nxt[U][4];
  if constexpr (PF) {  // tiles 1 .. kPrefetchTiles + 1; the loop then asks for tile t + kPrefetchTiles + 1 at tile t
    for (int d = 1; d <= kPrefetchTiles + 1; ++d) prefetch_tile_l2<VEC>(row, v0 + d * kStep, v1, kStep);
  }
  lean_load<DT, VEC, U>(cur, row, v0, v1);
  // Tile 0: count every entry, pick bmin, then keep what reaches it. Tile 0 is reloaded (L1 / L2 hits) for the
  // keep rather than held in registers across the refresh, and tile 1 is loaded only then: with both buffers
  // live across the refresh ptxas spilled 100-212 B / thread (sm_90a, 64 registers).
  visit_tile<DT, VEC, U>(cur, v0, v1, lo64, len, nullptr,
                         [&](uint32_t u, int, bool valid) { hist_add(s.hist, valid ? int(u >> kTopShift) : -1); });
  refresh();
  lean_load<DT, VEC, U>(cur, row, v0, v1);
  lean_load<DT, VEC, U>(nxt, row, v0 + kStep, v1);
  lean_tile<DT, VEC, U, false, false, true>(s, cur, v0, lo, ulen, thr, overflow, cu, cap);
  int t = 1;
  for (uint32_t it = v0 + kStep; it < v1; it += kStep, ++t) {
#pragma unroll
    for (int j = 0; j < U; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) cur[j][e] = nxt[j][e];
    }
    if constexpr (PF) prefetch_tile_l2<VEC>(row, it + (kPrefetchTiles + 1) * kStep, v1, kStep);
    lean_load<DT, VEC, U>(nxt, row, it + kStep, v1);  // past the row: no load, zeros
    lean_visit<DT, VEC, U>(s, cur, it, v1, lo, ulen, thr, overflow, cu, cap);
    if (t < 4 || (t & 3) == 3) refresh();
  }
  __syncthreads();
  *m_out = s.cand_count;
  return !overflow && *m_out <= cap;
}

// Steps 3-4 over the shared-memory candidates (cu / cc: u and column, st.cnt of them): refine digit by digit
// until the bucket is taken whole.
// u_low_fixed: 16-bit values (u = rank image of bits << 16): every candidate that reaches the u[9:0] digit has
// the same one (0; 0x3FF for NaN, whose prefix u[31:10] no other value shares), so that level's histogram and
// compaction are skipped: the digit is read from candidate 0 (need and count unchanged).
__device__ void refine_candidates(Shared& s, uint32_t* cu, int* cc, State st, int nb, uint32_t cmax, int* out,
                                  int64_t stride_ok, int col_off, bool u_low_fixed) {
  const int nlev = num_levels(nb);
  int m = st.cnt;
  while (st.cnt != st.need && st.li + 1 < nlev) {
    if (u_low_fixed && st.li + 1 == kULevels - 1) {  // m >= need >= 1; the last compaction ended with a sync
      ++st.li;
      st.prefix |= static_cast<uint64_t>(cu[0] & 0x3FFu) << 32;
      continue;
    }
    const Level lv = level_of(++st.li, nb);
    const uint64_t dmask = (1ull << lv.width) - 1;
    zero_hist(s);
    __syncthreads();
    for (int base = 0; base < m; base += kThreads) {
      const int i = base + threadIdx.x;
      const int bin = i < m ? static_cast<int>((make_key(cu[i], cc[i], cmax) >> lv.shift) & dmask) : -1;
      hist_add(s.hist, bin);
    }
    __syncthreads();
    choose(s, st.need);
    if (threadIdx.x == 0) s.cand_count = 0;
    __syncthreads();
    take_choice(s, st, lv);
    compact(s, cu, cc, m, lv.shift, st.prefix >> lv.shift, true, false, cmax, out, stride_ok, col_off);
    m = st.cnt;
  }
  // The bucket is taken whole (keys are unique, so the last digit always gets here with cnt == need).
  for (int base = 0; base < m; base += kThreads) {
    const int i = base + threadIdx.x;
    const int o = reserve(&s.out_count, i < m);
    if (o >= 0) put(out, stride_ok, o, cc[i] + col_off);
  }
}

// One CTA per (row, segment). DT | kGather: the split's merge (see below). segs > 1 (row-wise calls only, no
// starts): the split's first stage: CTA x takes segment x % segs (ceil(n / segs) rounded up to 8 columns) of row
// x / segs and writes its top k, as ids of the whole row, to row x of out ([b * segs, k]). Merge: CTA r reads
// gather_m column ids of row r of `gather` (the first stage's output viewed as [b, segs * k], -1 = none) and
// selects the top min(k, length) of the values they name in row r of scores; the key's column part is the id, so
// the tie rule is the row's.
template <int DT, bool VEC, int MODE>
__global__ void __launch_bounds__(kThreads, 2)
    topk_radix_kernel(const void* __restrict__ scores, int64_t n, int64_t stride_b, const int* __restrict__ lengths,
                      const int* __restrict__ starts, int* __restrict__ out, int64_t k, int64_t stride_ob,
                      int64_t stride_ok, int cap, int segs, const int* __restrict__ gather, int64_t gather_m) {
  constexpr bool kIsGather = (DT & kGather) != 0;
  constexpr int kVal = DT & ~kGather;  // the scores' dtype
  constexpr bool kLowFixed = Traits<kVal>::kBytes == 2;  // 16-bit: u[9:0] needs no level (refine_candidates)
  __shared__ Shared s;
  DS_DYNAMIC_SMEM(dyn);  // extern __shared__ uint32_t dyn[] on the GPU (see topk_radix.cu)
  uint32_t* cu = dyn;
  int* cc = reinterpret_cast<int*>(dyn + cap);

  const int64_t r = kIsGather ? static_cast<int64_t>(blockIdx.x) : static_cast<int64_t>(blockIdx.x) / segs;
  int64_t lo = 0, hi = n;
  if (starts != nullptr) lo = min(max(static_cast<int64_t>(starts[r]), int64_t{0}), n);
  if (lengths != nullptr) hi = min(max(static_cast<int64_t>(lengths[r]), lo), n);
  int col_off = starts != nullptr ? static_cast<int>(lo - starts[r]) : 0;
  const char* srow = static_cast<const char*>(scores) + r * stride_b * Traits<kVal>::kBytes;
  const void* row = srow;   // what the passes stream
  const void* gsrc = srow;  // where gather ids point (merge only)
  int kk, key_len;          // entries to choose; the key's column range
  if constexpr (kIsGather) {
    kk = static_cast<int>(min(hi - lo, k));
    key_len = static_cast<int>(n);
    col_off = 0;  // the ids are the row's columns
    row = gather + r * gather_m;
    lo = 0, hi = gather_m;
  } else {
    if (segs > 1) {  // first stage of the split (starts == nullptr): ids relative to the whole row
      const int64_t seg = (((n + segs - 1) / segs) + 7) & ~int64_t{7};
      const int64_t s0 = min(static_cast<int64_t>(blockIdx.x % segs) * seg, hi);
      lo = s0, hi = min(s0 + seg, hi);
      col_off = static_cast<int>(s0);
    }
    kk = static_cast<int>(min(hi - lo, k));
    key_len = static_cast<int>(hi - lo);
  }
  const int len = static_cast<int>(hi - lo);  // positions streamed
  int* orow = out + static_cast<int64_t>(blockIdx.x) * stride_ob;

  for (int64_t i = kk + threadIdx.x; i < k; i += kThreads) orow[i * stride_ok] = -1;
  if (kIsGather ? kk == 0 : kk == len) {  // nothing to choose, or every valid entry: no selection
    for (int i = threadIdx.x; !kIsGather && i < len; i += kThreads) put(orow, stride_ok, i, i + col_off);
    return;
  }

  const int nb = 32 - __clz(static_cast<unsigned>(key_len - 1) | 1u);  // column bits (key_len >= 2 here)
  const uint32_t cmax = nb >= 32 ? 0xffffffffu : ((1u << nb) - 1u);
  const int nlev = num_levels(nb);
  State st{0, kk, 0, 0};

  // 1. the first digit over the whole row (one-read modes: also keeping every entry that may make the top kk).
  zero_hist(s);
  if (threadIdx.x == 0) s.out_count = 0, s.cand_count = 0;
  __syncthreads();
  bool streamed = false;
  int m = 0;
  if constexpr ((MODE == kModeLean || MODE == kModeLeanPf) && !kIsGather) {
    streamed = stream_pass_lean<DT, VEC, MODE == kModeLeanPf>(s, row, lo, len, kk, cu, cc, cap, cmax, &m);
  } else if constexpr (MODE == kModeFast || MODE == kModeLean || MODE == kModeLeanPf) {
    streamed = stream_pass_fast<DT, VEC>(s, row, lo, len, gsrc, kk, cu, cc, cap, cmax, &m);
  } else if constexpr (MODE == kModeOneRead) {
    streamed = stream_pass<DT, VEC>(s, row, lo, len, gsrc, kk, cu, cc, cap, cmax, &m);
  } else {
    for_each_entry<DT, VEC>(row, lo, len, gsrc, [&](uint32_t u, int, bool valid) {
      hist_add(s.hist, valid ? static_cast<int>(u >> kTopShift) : -1);
    });
  }
  __syncthreads();  // the histogram is complete and everyone has read cand_count
  choose(s, st.need);
  if (threadIdx.x == 0) s.cand_count = 0;
  __syncthreads();
  take_choice(s, st, level_of(0, nb));
  if (streamed) {  // every entry of the chosen bucket is in the buffer: split it there, no second read
    const bool take_all = st.cnt == st.need;
    compact(s, cu, cc, m, kTopKeyShift, st.prefix >> kTopKeyShift, true, take_all, cmax, orow, stride_ok, col_off);
    if (!take_all) refine_candidates(s, cu, cc, st, nb, cmax, orow, stride_ok, col_off, kLowFixed);
    return;
  }

  // 2. more row passes while the bucket overflows the candidate buffer (heavy ties).
  while (st.cnt > cap && st.cnt != st.need && st.li + 1 < nlev) {
    const Level prev = level_of(st.li, nb), lv = level_of(++st.li, nb);
    const uint64_t p = st.prefix >> prev.shift, dmask = (1ull << lv.width) - 1;
    __syncthreads();  // everyone has read s.sel_* of the previous pick
    zero_hist(s);
    __syncthreads();
    for_each_entry<DT, VEC>(row, lo, len, gsrc, [&](uint32_t u, int col, bool valid) {
      const uint64_t key = make_key(u, col, cmax);
      const bool match = valid && (key >> prev.shift) == p;
      hist_add(s.hist, match ? static_cast<int>((key >> lv.shift) & dmask) : -1);
    });
    __syncthreads();
    choose(s, st.need);
    __syncthreads();
    take_choice(s, st, lv);
  }

  // 3. collect: above the bucket -> output; the bucket -> candidates (or output when taken whole).
  const Level lv = level_of(st.li, nb);
  const uint64_t p = st.prefix >> lv.shift;
  const bool take_all = st.cnt == st.need;
  for_each_entry<DT, VEC>(row, lo, len, gsrc, [&](uint32_t u, int col, bool valid) {
    const uint64_t key = make_key(u, col, cmax) >> lv.shift;
    const bool in_bucket = valid && key == p;
    const int o = reserve(&s.out_count, valid && (key > p || (take_all && in_bucket)));
    if (o >= 0) put(orow, stride_ok, o, col + col_off);
    const int slot = reserve(&s.cand_count, !take_all && in_bucket);
    if (slot >= 0 && slot < cap) cu[slot] = u, cc[slot] = col;  // slot < cnt <= cap here; the test is a guard
  });
  if (take_all) return;
  __syncthreads();

  // 4. the remaining digits over the candidates.
  refine_candidates(s, cu, cc, st, nb, cmax, orow, stride_ok, col_off, kLowFixed);
}

}  // namespace detail
}  // namespace deep_select
