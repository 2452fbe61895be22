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
// Per element in pass 1: ~6 integer ops for the key, a shuffle + vote for the warp-uniform-bin shortcut
// (all-equal rows would otherwise serialise 32 atomics on one bank), one shared atomic, and in one-read mode a
// compare + ballot. Few rows (b < 132) leave SMs idle: one CTA streams a row at ~32 KB in flight.

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "topk_radix.cuh"

#define DS_DYNAMIC_SMEM(name) extern __shared__ uint32_t name[]
#include "topk_radix_kernel.cuh"

namespace deep_select {
namespace {

constexpr int kMaxDevices = 64;

template <int DT, bool VEC, bool STREAM>
cudaError_t launch(const void* scores, int64_t b, int64_t n, int64_t stride_b, const int* lengths, const int* starts,
                   int* out, int64_t k, int64_t stride_ob, int64_t stride_ok, int cap, cudaStream_t stream) {
  const int smem = topk_radix_smem_bytes(cap);
  auto* kernel = detail::topk_radix_kernel<DT, VEC, STREAM>;
  // Above 48 KB of dynamic shared memory needs an opt-in, per device: set it once per (instantiation, device)
  // with the largest size asked so far, so that calls during CUDA-graph capture (after a warm-up call, as the
  // API's contract asks) only launch.
  if (smem > 48 * 1024) {
    static int configured[kMaxDevices] = {};
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 0 || dev >= kMaxDevices || smem > configured[dev]) {
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (err != cudaSuccess) return err;
      if (dev >= 0 && dev < kMaxDevices) configured[dev] = smem;
    }
  }
  kernel<<<static_cast<unsigned>(b), detail::kThreads, smem, stream>>>(scores, n, stride_b, lengths, starts, out, k,
                                                                        stride_ob, stride_ok, cap);
  return cudaGetLastError();
}

template <int DT>
cudaError_t launch_vec(bool vec, bool one_read, const void* scores, int64_t b, int64_t n, int64_t stride_b,
                       const int* lengths, const int* starts, int* out, int64_t k, int64_t stride_ob,
                       int64_t stride_ok, int cap, cudaStream_t stream) {
  const auto* l = lengths;
  const auto* s = starts;
  const int64_t sb = stride_b, so = stride_ob, sk = stride_ok;
  if (vec && one_read) return launch<DT, true, true>(scores, b, n, sb, l, s, out, k, so, sk, cap, stream);
  if (vec) return launch<DT, true, false>(scores, b, n, sb, l, s, out, k, so, sk, cap, stream);
  if (one_read) return launch<DT, false, true>(scores, b, n, sb, l, s, out, k, so, sk, cap, stream);
  return launch<DT, false, false>(scores, b, n, sb, l, s, out, k, so, sk, cap, stream);
}

}  // namespace

int topk_radix_smem_bytes(int cap) { return cap * 8; }

int topk_radix_launch(std::uintptr_t scores, int dtype, std::int64_t b, std::int64_t n, std::int64_t stride_b,
                      std::uintptr_t lengths, std::uintptr_t starts, std::uintptr_t out, std::int64_t k,
                      std::int64_t stride_ob, std::int64_t stride_ok, int cap, bool vec, bool one_read,
                      std::uintptr_t stream) {
  if (b <= 0) return 0;
  const auto* sp = reinterpret_cast<const void*>(scores);
  const auto* lp = reinterpret_cast<const int*>(lengths);
  const auto* st = reinterpret_cast<const int*>(starts);
  auto* op = reinterpret_cast<int*>(out);
  auto strm = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t err = cudaErrorInvalidValue;
  switch (dtype) {
    case kFloat32:
      err = launch_vec<kFloat32>(vec, one_read, sp, b, n, stride_b, lp, st, op, k, stride_ob, stride_ok, cap, strm);
      break;
    case kBFloat16:
      err = launch_vec<kBFloat16>(vec, one_read, sp, b, n, stride_b, lp, st, op, k, stride_ob, stride_ok, cap, strm);
      break;
    case kFloat16:
      err = launch_vec<kFloat16>(vec, one_read, sp, b, n, stride_b, lp, st, op, k, stride_ob, stride_ok, cap, strm);
      break;
    default:
      break;
  }
  return static_cast<int>(err);
}

}  // namespace deep_select
