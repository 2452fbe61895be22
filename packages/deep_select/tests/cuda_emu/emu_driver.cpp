// Runs topk_radix_kernel.cuh on the CPU (see emu.h); built and loaded through ctypes by test_ds_topk_cuda.py.
#include <thread>

#include "emu.h"
#include "topk_radix.cuh"
#include "topk_radix_kernel.cuh"

namespace {

template <int DT, bool VEC, bool STREAM>
void run_blocks(const void* scores, int64_t b, int64_t n, int64_t stride_b, const int* lengths, const int* starts,
                int* out, int64_t k, int64_t stride_ob, int64_t stride_ok, int cap) {
  using deep_select::detail::kThreads;
  emu::dyn.assign(static_cast<size_t>(cap) * 2, 0xDEADBEEFu);
  std::barrier<> block_bar(kThreads);
  std::vector<std::barrier<>*> warp_bars;
  for (int w = 0; w < kThreads / 32; ++w) warp_bars.push_back(new std::barrier<>(32));
  emu::block_bar = &block_bar;
  emu::warp_bars = warp_bars;
  for (int64_t blk = 0; blk < b; ++blk) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([=] {
        threadIdx.x = t;
        blockIdx.x = static_cast<unsigned>(blk);
        deep_select::detail::topk_radix_kernel<DT, VEC, STREAM>(scores, n, stride_b, lengths, starts, out, k, stride_ob,
                                                        stride_ok, cap);
      });
    }
    for (auto& th : threads) th.join();
  }
  for (auto* p : warp_bars) delete p;
}

template <int DT>
void run_vec(int vec, const void* scores, int64_t b, int64_t n, int64_t stride_b, const int* lengths,
             const int* starts, int* out, int64_t k, int64_t stride_ob, int64_t stride_ok, int cap) {
  // vec: bit 0 = 16-byte loads, bit 1 = one-read (stream) mode
  switch (vec & 3) {
    case 0:
      return run_blocks<DT, false, false>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
    case 1:
      return run_blocks<DT, true, false>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
    case 2:
      return run_blocks<DT, false, true>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
    default:
      return run_blocks<DT, true, true>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
  }
}

}  // namespace

extern "C" int emu_topk_radix(const void* scores, int dtype, int64_t b, int64_t n, int64_t stride_b,
                              const int* lengths, const int* starts, int* out, int64_t k, int64_t stride_ob,
                              int64_t stride_ok, int cap, int flags) {
  const int64_t sb = stride_b, so = stride_ob, sk = stride_ok;
  switch (dtype) {
    case deep_select::kFloat32:
      run_vec<deep_select::kFloat32>(flags, scores, b, n, sb, lengths, starts, out, k, so, sk, cap);
      return 0;
    case deep_select::kBFloat16:
      run_vec<deep_select::kBFloat16>(flags, scores, b, n, sb, lengths, starts, out, k, so, sk, cap);
      return 0;
    case deep_select::kFloat16:
      run_vec<deep_select::kFloat16>(flags, scores, b, n, sb, lengths, starts, out, k, so, sk, cap);
      return 0;
    default:
      return 1;
  }
}
