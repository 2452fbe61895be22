// deep_select: exact row-wise top-k on Hopper by radix select over a unique 64-bit key (CUDA C++, no torch).
//
// Contract (api.py / reference.py): larger value first; -0.0 == +0.0; -inf after every finite value; NaN below
// -inf but still valid; ties -> lower column; columns outside [lo, hi) never chosen; slots kk .. k-1 get -1.
// Every entry gets the reference's unique key K = (u << 32) | (cmax - col): u is the order-preserving image of the
// raw bits (the Triton kernels' int32 key with its sign bit flipped, so unsigned order == rank order) and
// cmax - col (cmax = 2^nb - 1, nb = bits of the row's last column) makes the lower column win a value tie. Keys
// are unique, so an MSD radix select on K ends with exactly `need` entries in the chosen bucket: no ordered
// compaction and no tie special case anywhere.
//
// One CTA (512 threads) per row. Digits of K, most significant first: u[31:20], u[19:10], u[9:0] (12/10/10
// bits), then the nb column bits in <= 11-bit digits.
//   1. the one HBM read: 4096-bin histogram of u >> 20 in shared memory. One-read mode (STREAM, the default)
//      also keeps, tile by tile (512 threads x 4 x 16 B), every entry at or above bmin = the bucket of the kk-th
//      best entry seen so far, a lower bound of the final bucket (from the registers the histogram used: no
//      second load); the buffer is pruned to the current bmin when half full. Then pick the bucket B holding the
//      kk-th best key (need = kk minus the count above it); the kept entries above B go to the output, those in
//      B stay, and step 4 follows. If the kept entries overflowed the buffer (ascending rows, heavy ties), the
//      row continues with steps 2-3 (the histogram is complete).
//   2. while B holds more than `cap` entries (heavy ties, all-equal rows): another row pass histograms the next
//      digit of the bucket's entries (rare: normal rows never get here).
//   3. collect pass (two-pass mode or overflow; second read of the row, from L2 when the rows in flight fit):
//      entries above the bucket go straight to the output (warp-aggregated slot counter), the bucket's entries
//      to the shared-memory candidate buffer (or straight out when the whole bucket is taken).
//   4. the remaining digits run over the candidates only (shared memory), each one a histogram, a bucket pick
//      and an in-place compaction, until the bucket is taken whole.
//
// Bytes and occupancy: fp32 b = 256, n = 65,536 is 67 MB of scores (16.5 us at the 4.07 TB/s copy ceiling).
// 512 threads x 4 x 16-byte loads = 32 KB in flight per CTA, 2 CTAs per SM (64 regs/thread by launch bounds,
// 2 x (64 KB candidates + 18 KB static) of shared memory) -> 264 rows in flight = every row of b = 256 at once.
// One-read mode reads each byte once; two-pass mode re-reads each row, from the 50 MB L2 only while the rows in
// flight fit (264 x 256 KB = 67 MB does not quite; 264 x 1 MB at n = 262,144 does not at all). Normal rows keep
// ~kk (1 + ln(n / tile)) entries plus bucket neighbours in one-read mode (a few thousand at k = 2,048, under
// the 8,192-entry cap); the u >> 20 bucket at the top 0.8 % (x ~ 2.4: sign, 8 exponent bits, 3 mantissa bits ->
// [2.25, 2.5)) holds ~0.5 % of n: ~300 entries at n = 65,536, ~1,300 at 262,144, so steps 2 are skipped.
// Round 2 (mode kModeFast, the API's default; stream_pass_fast in topk_radix_kernel.cuh): the histogram counts
// (and the buffer keeps) only entries at or above the running bmin, so after the first tiles an entry costs the
// key, a compare and a warp vote; bmin is refreshed after tiles 0-3 then every 4th (8,192 entries per tile); the
// next tile is loaded into registers before the current one is visited (64 regs, no spills, ptxas sm_90a).
// Few long rows: the split (segs > 1: grid b x segs, each CTA a segment's top k as row ids into a [b, segs x k]
// scratch; then the gather merge, grid b, over those ids) puts up to 2 x 132 CTAs on b < 132 rows.
// Round 1's per-element cost (the one_read / two_pass modes), for comparison: ~6 integer ops for the key, a
// shuffle + vote for the warp-uniform-bin shortcut (all-equal rows would otherwise serialise 32 atomics on one
// bank), one shared atomic, and in one-read mode a compare + ballot. Without the split, few rows (b < 132) leave
// SMs idle: one CTA streams a row at ~32 KB in flight.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cub/block/block_scan.cuh>

#include "topk_radix.cuh"

#define DS_DYNAMIC_SMEM(name) extern __shared__ uint32_t name[]
#include "topk_radix_kernel.cuh"

namespace deep_select {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kMaxCap = 8192;  // the Python side's DEFAULT_CAP: 64 KB of dynamic shared memory

// The last launch failure, for topk_radix_error_string (one host thread launches per process in practice; a
// race only garbles a message).
char g_last_error[512] = "";

// Opts the instantiation in to kMaxCap slots of dynamic shared memory, once per (instantiation, device): the
// kernel's 16.5 KB of static shared memory plus the dynamic part must stay under 48 KB without the opt-in, so
// round 1's "only above 48 KB of dynamic memory" test missed caps of ~4,000-6,000 slots (n = 4096 ->
// cudaErrorInvalidValue). Setting the maximum up front means calls during CUDA-graph capture only launch.
// Templated on the variant, not on the kernel's type: every variant has the same signature, so a flag keyed by
// the type was shared by all of them and only the first variant launched on a device got the opt-in.
template <int DT, bool VEC, int MODE, class K>
cudaError_t opt_in_smem(K* kernel) {
  static bool configured[kMaxDevices] = {};  // one array per variant (a static of a template function)
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 0 && dev < kMaxDevices && configured[dev]) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, topk_radix_smem_bytes(kMaxCap));
  if (err == cudaSuccess && dev >= 0 && dev < kMaxDevices) configured[dev] = true;
  return err;
}

// Extra arguments of the split (see the kernel): segs > 1 = first stage, gather != nullptr = merge.
struct Split {
  int segs;
  const int* gather;
  int64_t gather_m;
};

template <int DT, bool VEC, int MODE>
cudaError_t launch(const void* scores, int64_t b, int64_t n, int64_t stride_b, const int* lengths, const int* starts,
                   int* out, int64_t k, int64_t stride_ob, int64_t stride_ok, int cap, Split sp,
                   cudaStream_t stream) {
  const int smem = topk_radix_smem_bytes(cap);
  auto* kernel = detail::topk_radix_kernel<DT, VEC, MODE>;
  cudaError_t err = cudaSuccess;
  const char* step = "argument check (cap 1 .. 8192, b < 2^31)";
  const int64_t grid = b * (sp.gather == nullptr ? sp.segs : 1);
  if (cap < 1 || cap > kMaxCap || grid > 0x7fffffffLL || sp.segs < 1) err = cudaErrorInvalidValue;
  if (err == cudaSuccess) {
    err = opt_in_smem<DT, VEC, MODE>(kernel);
    step = "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)";
  }
  if (err == cudaSuccess) {
    kernel<<<static_cast<unsigned>(grid), detail::kThreads, smem, stream>>>(
        scores, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap, sp.segs, sp.gather, sp.gather_m);
    err = cudaGetLastError();
    step = "launch";
  }
  if (err != cudaSuccess) {
    snprintf(g_last_error, sizeof(g_last_error),
             "%s failed: %s (cudaError_t %d); variant dtype=%d vec=%d mode=%d, grid=%lld x %d threads, dynamic "
             "smem=%d B (cap %d), static smem=%d B, n=%lld k=%lld segs=%d gather_m=%lld",
             step, cudaGetErrorString(err), static_cast<int>(err), DT, VEC ? 1 : 0, MODE, static_cast<long long>(grid),
             detail::kThreads, smem, cap, static_cast<int>(sizeof(detail::Shared)), static_cast<long long>(n),
             static_cast<long long>(k), sp.segs, static_cast<long long>(sp.gather_m));
  }
  return err;
}

template <int DT>
cudaError_t launch_vec(bool vec, int mode, const void* scores, int64_t b, int64_t n, int64_t stride_b,
                       const int* lengths, const int* starts, int* out, int64_t k, int64_t stride_ob,
                       int64_t stride_ok, int cap, Split sp, cudaStream_t stream) {
  const auto* l = lengths;
  const auto* s = starts;
  const int64_t sb = stride_b, so = stride_ob, sk = stride_ok;
  using detail::kGather;
  using detail::kModeFast;
  using detail::kModeLean;
  using detail::kModeLeanPf;
  using detail::kModeOneRead;
  using detail::kModeTwoPass;
  if (sp.gather != nullptr) {  // the split's merge: fast mode only
    if (vec) return launch<DT | kGather, true, kModeFast>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
    return launch<DT | kGather, false, kModeFast>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
  }
  if (vec) {
    if (mode == kModeLean) return launch<DT, true, kModeLean>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
    if (mode == kModeLeanPf)
      return launch<DT, true, kModeLeanPf>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
    if (mode == kModeFast) return launch<DT, true, kModeFast>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
    if (mode == kModeOneRead)
      return launch<DT, true, kModeOneRead>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
    return launch<DT, true, kModeTwoPass>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
  }
  if (mode == kModeLean || mode == kModeLeanPf)  // no prefetch without 16-byte loads: plain lean
    return launch<DT, false, kModeLean>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
  if (mode == kModeFast) return launch<DT, false, kModeFast>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
  if (mode == kModeOneRead)
    return launch<DT, false, kModeOneRead>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
  return launch<DT, false, kModeTwoPass>(scores, b, n, sb, l, s, out, k, so, sk, cap, sp, stream);
}

}  // namespace

int topk_radix_smem_bytes(int cap) { return cap * 8; }

const char* topk_radix_error_string() { return g_last_error; }

int topk_radix_launch(std::uintptr_t scores, int dtype, std::int64_t b, std::int64_t n, std::int64_t stride_b,
                      std::uintptr_t lengths, std::uintptr_t starts, std::uintptr_t out, std::int64_t k,
                      std::int64_t stride_ob, std::int64_t stride_ok, int cap, bool vec, int mode, int segs,
                      std::uintptr_t gather, std::int64_t gather_m, std::uintptr_t stream) {
  if (b <= 0) return 0;
  const Split split{segs, reinterpret_cast<const int*>(gather), gather_m};
  const auto* sp = reinterpret_cast<const void*>(scores);
  const auto* lp = reinterpret_cast<const int*>(lengths);
  const auto* st = reinterpret_cast<const int*>(starts);
  auto* op = reinterpret_cast<int*>(out);
  auto strm = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t err = cudaErrorInvalidValue;
  snprintf(g_last_error, sizeof(g_last_error), "unknown dtype code %d or mode %d", dtype, mode);
  if (mode < detail::kModeTwoPass || mode > detail::kModeLeanPf) return static_cast<int>(err);
  switch (dtype) {
    case kFloat32:
      err = launch_vec<kFloat32>(vec, mode, sp, b, n, stride_b, lp, st, op, k, stride_ob, stride_ok, cap, split, strm);
      break;
    case kBFloat16:
      err = launch_vec<kBFloat16>(vec, mode, sp, b, n, stride_b, lp, st, op, k, stride_ob, stride_ok, cap, split, strm);
      break;
    case kFloat16:
      err = launch_vec<kFloat16>(vec, mode, sp, b, n, stride_b, lp, st, op, k, stride_ob, stride_ok, cap, split, strm);
      break;
    default:
      break;
  }
  return static_cast<int>(err);
}

}  // namespace deep_select
