// Runs topk_radix_kernel.cuh on the CPU (see emu.h); built and loaded through ctypes by test_ds_topk_cuda.py.
#include <thread>

#include "emu.h"
#include "topk_radix.cuh"
#include "topk_radix_kernel.cuh"

namespace {

struct Split {
  int segs;
  const int* gather;
  int64_t gather_m;
};
inline Split g_split{1, nullptr, 0};  // the split arguments of the current call (one call at a time)

template <int DT, bool VEC, int MODE>
void run_blocks(const void* scores, int64_t b, int64_t n, int64_t stride_b, const int* lengths, const int* starts,
                int* out, int64_t k, int64_t stride_ob, int64_t stride_ok, int cap) {
  const Split sp = g_split;
  const int64_t grid = sp.gather != nullptr ? b : b * sp.segs;
  using deep_select::detail::kThreads;
  emu::dyn.assign(static_cast<size_t>(cap) * 2, 0xDEADBEEFu);
  std::barrier<> block_bar(kThreads);
  std::vector<std::barrier<>*> warp_bars;
  for (int w = 0; w < kThreads / 32; ++w) warp_bars.push_back(new std::barrier<>(32));
  emu::block_bar = &block_bar;
  emu::warp_bars = warp_bars;
  for (int64_t blk = 0; blk < grid; ++blk) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([=] {
        threadIdx.x = t;
        blockIdx.x = static_cast<unsigned>(blk);
        deep_select::detail::topk_radix_kernel<DT, VEC, MODE>(scores, n, stride_b, lengths, starts, out, k, stride_ob,
                                                              stride_ok, cap, sp.segs, sp.gather, sp.gather_m);
      });
    }
    for (auto& th : threads) th.join();
  }
  for (auto* p : warp_bars) delete p;
}

template <int DT>
void run_vec(int vec, const void* scores, int64_t b, int64_t n, int64_t stride_b, const int* lengths,
             const int* starts, int* out, int64_t k, int64_t stride_ob, int64_t stride_ok, int cap) {
  // flags: bit 0 = 16-byte loads, bits 1-3 = mode (0 two-pass, 1 one-read, 2 fast one-read, 3 lean, 4 lean + L2 prefetch)
  const bool v = (vec & 1) != 0;
  if (g_split.gather != nullptr) {  // the split's merge: fast mode only
    constexpr int G = DT | deep_select::detail::kGather;
    if (v) return run_blocks<G, true, 2>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
    return run_blocks<G, false, 2>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
  }
  switch (vec >> 1) {
    case 0:
      if (v) return run_blocks<DT, true, 0>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
      return run_blocks<DT, false, 0>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
    case 1:
      if (v) return run_blocks<DT, true, 1>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
      return run_blocks<DT, false, 1>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
    case 3:
      if (v) return run_blocks<DT, true, 3>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
      return run_blocks<DT, false, 3>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
    case 4:  // lean + L2 prefetch (the prefetch is a no-op here)
      if (v) return run_blocks<DT, true, 4>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
      return run_blocks<DT, false, 3>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
    default:
      if (v) return run_blocks<DT, true, 2>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
      return run_blocks<DT, false, 2>(scores, b, n, stride_b, lengths, starts, out, k, stride_ob, stride_ok, cap);
  }
}

}  // namespace

extern "C" int emu_topk_radix(const void* scores, int dtype, int64_t b, int64_t n, int64_t stride_b,
                              const int* lengths, const int* starts, int* out, int64_t k, int64_t stride_ob,
                              int64_t stride_ok, int cap, int flags, int segs, const int* gather,
                              int64_t gather_m) {
  const int64_t sb = stride_b, so = stride_ob, sk = stride_ok;
  g_split = Split{segs, gather, gather_m};
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
