// CPU driver of the emulated W4A16 grouped kernel (emu.h + csrc/cuda/dg_fp4_grouped.cuh): runs every CTA of the
// grid, one at a time, each as WARPS * 32 std::threads. Built and called by tests/test_dg_fp4_cuda.py (ctypes).
#include "emu.h"

#include <thread>

#define DG_FP4_EMU 1
#include "dg_fp4_grouped.cuh"
#include "dg_fp4_persistent.cuh"

namespace {

// One CTA (bx, by) of a grid of gx CTAs along x: `threads` std::threads over `smem_bytes` of garbage shared memory.
template <typename Fn>
void run_cta(int threads, int warps, int smem_bytes, int bx, int by, int gx, Fn kernel) {
  // 0xFF garbage (bf16 NaN activations, scale byte 255): the persistent kernel does not copy rows past n or tokens
  // past an expert's end, so this must stay confined to outputs it never stores
  emu::smem.assign(smem_bytes, 0xFF);
  std::barrier<> block(threads);
  std::vector<std::barrier<>*> wb;
  for (int w = 0; w < warps; ++w) wb.push_back(new std::barrier<>(32));
  emu::block_bar = &block;
  emu::warp_bars = wb;
  std::vector<std::thread> ths;
  for (int t = 0; t < threads; ++t) {
    ths.emplace_back([&, t] {
      threadIdx = EmuDim{static_cast<unsigned>(t), 0, 0};
      blockIdx = EmuDim{static_cast<unsigned>(bx), static_cast<unsigned>(by), 0};
      gridDim = EmuDim{static_cast<unsigned>(gx), 1, 1};
      emu::groups.clear();
      emu::open_group.clear();
      kernel();
    });
  }
  for (auto& th : ths) th.join();
  for (auto* w : wb) delete w;
}

// The persistent kernel (kernel 5) over a grid of `grid` CTAs (any size: each CTA strides over the work items).
template <int KT, int TN, int WARPS, int RT, int NS>
void run_p_grid(const dg_fp4::Fp4Args& p, int grid) {
  using C = dg_fp4::PCfg<KT, TN, WARPS, RT, NS>;
  for (int bx = 0; bx < grid; ++bx) {
    run_cta(C::kThreads, WARPS, C::kSmemBytes + dg_fp4::p_extra_bytes(p.g), bx, 0, grid,
            [&] { dg_fp4::fp4_w4a16_persistent_kernel<KT, TN, WARPS, RT, NS>(p); });
  }
}

template <int TN, int WARPS, int RT, int NS>
void run_grid(const dg_fp4::Fp4Args& p) {
  using C = dg_fp4::Fp4Cfg<TN, WARPS, RT, NS>;
  const int gx = (p.n + C::kRows - 1) / C::kRows;
  for (int by = 0; by < p.g; ++by) {
    for (int bx = 0; bx < gx; ++bx) {
      emu::smem.assign(C::kSmemBytes, 0xA5);  // garbage: the kernel must never read a byte it did not copy
      std::barrier<> block(C::kThreads);
      std::vector<std::barrier<>*> warps;
      for (int w = 0; w < WARPS; ++w) warps.push_back(new std::barrier<>(32));
      emu::block_bar = &block;
      emu::warp_bars = warps;
      std::vector<std::thread> threads;
      for (int t = 0; t < C::kThreads; ++t) {
        threads.emplace_back([&, t] {
          threadIdx = EmuDim{static_cast<unsigned>(t), 0, 0};
          blockIdx = EmuDim{static_cast<unsigned>(bx), static_cast<unsigned>(by), 0};
          emu::groups.clear();
          emu::open_group.clear();
          dg_fp4::fp4_w4a16_grouped_kernel<TN, WARPS, RT, NS>(p);
        });
      }
      for (auto& th : threads) th.join();
      for (auto* w : warps) delete w;
    }
  }
}

}  // namespace

extern "C" int emu_w4a16(int tn, int warps, int rt, int stages, const void* a, const void* packed,
                         const void* scales, const void* offs, void* out, int m, int n, int k, int g, int late) {
  emu::late = late != 0;
  dg_fp4::Fp4Args p{static_cast<const __nv_bfloat16*>(a), static_cast<const uint8_t*>(packed),
                    static_cast<const uint8_t*>(scales), static_cast<const int*>(offs),
                    static_cast<__nv_bfloat16*>(out), m, n, k, g, 1u << 26};
#define DG_FP4_EMU_CASE(TN, W, RT, NS)                         \
  if (tn == TN && warps == W && rt == RT && stages == NS) {    \
    run_grid<TN, W, RT, NS>(p);                                \
    return 0;                                                  \
  }
  DG_FP4_EMU_CASE(8, 4, 2, 4)
  DG_FP4_EMU_CASE(8, 4, 1, 4)
  DG_FP4_EMU_CASE(8, 8, 1, 4)
  DG_FP4_EMU_CASE(8, 4, 2, 6)
  DG_FP4_EMU_CASE(16, 4, 2, 4)
  DG_FP4_EMU_CASE(16, 4, 1, 4)
  DG_FP4_EMU_CASE(16, 8, 1, 4)
  DG_FP4_EMU_CASE(32, 4, 2, 3)
  DG_FP4_EMU_CASE(32, 8, 1, 3)
  DG_FP4_EMU_CASE(64, 4, 2, 3)
  DG_FP4_EMU_CASE(64, 8, 1, 3)
  return -1;
}

extern "C" int emu_w4a16_p(int kt, int tn, int warps, int rt, int stages, const void* a, const void* packed,
                           const void* scales, const void* offs, void* out, int m, int n, int k, int g, int late,
                           int grid) {
  emu::late = late != 0;
  dg_fp4::Fp4Args p{static_cast<const __nv_bfloat16*>(a), static_cast<const uint8_t*>(packed),
                    static_cast<const uint8_t*>(scales), static_cast<const int*>(offs),
                    static_cast<__nv_bfloat16*>(out), m, n, k, g, 1u << 26};
#define DG_FP4_EMU_PCASE(KT, TN, W, RT, NS)                                 \
  if (kt == KT && tn == TN && warps == W && rt == RT && stages == NS) {     \
    run_p_grid<KT, TN, W, RT, NS>(p, grid);                                 \
    return 0;                                                               \
  }
  DG_FP4_EMU_PCASE(256, 8, 4, 1, 4)
  DG_FP4_EMU_PCASE(512, 8, 4, 1, 2)
  DG_FP4_EMU_PCASE(512, 8, 8, 1, 2)
  DG_FP4_EMU_PCASE(256, 8, 4, 2, 3)
  DG_FP4_EMU_PCASE(512, 8, 4, 2, 2)
  DG_FP4_EMU_PCASE(256, 8, 4, 1, 3)
  DG_FP4_EMU_PCASE(256, 8, 4, 2, 4)
  DG_FP4_EMU_PCASE(256, 16, 4, 1, 4)
  DG_FP4_EMU_PCASE(512, 16, 4, 1, 2)
  DG_FP4_EMU_PCASE(256, 32, 4, 1, 4)
  DG_FP4_EMU_PCASE(256, 32, 4, 2, 3)
  DG_FP4_EMU_PCASE(512, 32, 8, 1, 2)
  DG_FP4_EMU_PCASE(256, 64, 8, 1, 3)
  return -1;
}
