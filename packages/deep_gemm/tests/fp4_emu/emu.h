// CPU emulation of the CUDA features csrc/cuda/dg_fp4_grouped.cuh uses (its PTX primitives), so the CPU tests run
// the kernel's own index logic: loader, swizzles, k permutation, MMA fragments, dequant bits, epilogue.
//
// One CTA at a time; its threads are std::threads. __syncthreads is a block barrier; mma.sync exchanges the 32
// lanes' fragments through a per-warp array between two warp barriers (the kernel calls it in lockstep). cp.async:
// mode "early" copies at issue (the strictest order for write-after-read hazards on a stage), mode "late" queues
// the copies per thread and performs them at cp.async.wait_group (the strictest for read-before-landed).
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x)

struct EmuDim {
  unsigned x, y, z;
};
inline thread_local EmuDim threadIdx{0, 0, 0};
inline thread_local EmuDim blockIdx{0, 0, 0};
inline thread_local EmuDim gridDim{1, 1, 1};
struct uint4 {
  uint32_t x, y, z, w;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
using std::max;
using std::min;

namespace emu {
inline std::vector<uint8_t> smem;
inline std::barrier<>* block_bar = nullptr;
inline std::vector<std::barrier<>*> warp_bars;
inline bool late = false;
struct Lane {
  uint32_t a[4], b[2];
  float c[4];
};
inline Lane lanes[1024];
inline int votes[1024];
struct Copy {
  uint32_t dst;
  const void* src;
  int bytes;
  bool pred;
};
inline thread_local std::deque<std::vector<Copy>> groups;  // committed groups, oldest first
inline thread_local std::vector<Copy> open_group;

inline void do_copy(const Copy& c) {
  if (c.pred) {
    std::memcpy(smem.data() + c.dst, c.src, c.bytes);
  } else {
    std::memset(smem.data() + c.dst, 0, c.bytes);
  }
}
inline float bf16_to_f(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f_to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
}  // namespace emu

#define DG_FP4_DYNAMIC_SMEM(name) uint8_t* name = emu::smem.data()
inline uintptr_t __cvta_generic_to_shared(const void* p) {
  return static_cast<uintptr_t>(static_cast<const uint8_t*>(p) - emu::smem.data());
}
inline void __syncthreads() { emu::block_bar->arrive_and_wait(); }
// Warp votes (the kernels call them with the whole warp converged): every lane posts, then reads all 32.
inline uint32_t __ballot_sync(uint32_t, int pred) {
  const int warp = threadIdx.x >> 5;
  emu::votes[threadIdx.x] = pred != 0;
  emu::warp_bars[warp]->arrive_and_wait();
  uint32_t mask = 0;
  for (int l = 0; l < 32; ++l) mask |= static_cast<uint32_t>(emu::votes[warp * 32 + l]) << l;
  emu::warp_bars[warp]->arrive_and_wait();
  return mask;
}
inline bool __any_sync(uint32_t m, int pred) { return __ballot_sync(m, pred) != 0; }
// Shuffles (whole warp converged, as the kernels call them): every lane posts its value, then reads its source's.
inline int emu_shfl(int v, int src_lane) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  emu::votes[threadIdx.x] = v;
  emu::warp_bars[warp]->arrive_and_wait();
  const int got = emu::votes[warp * 32 + ((src_lane >= 0 && src_lane < 32) ? src_lane : lane)];
  emu::warp_bars[warp]->arrive_and_wait();
  return got;
}
inline int __shfl_sync(uint32_t, int v, int src) { return emu_shfl(v, src & 31); }
inline int __shfl_up_sync(uint32_t, int v, unsigned d) {  // lanes below d keep their own value (PTX shfl.up)
  const int lane = threadIdx.x & 31;
  return emu_shfl(v, lane >= static_cast<int>(d) ? lane - static_cast<int>(d) : lane);
}
inline int __popc(uint32_t x) { return __builtin_popcount(x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{emu::f_to_bf16(f)}; }
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (s >> (4 * i)) & 0xF;
    uint32_t byte = static_cast<uint32_t>(v >> (8 * (sel & 7))) & 0xFF;
    if (sel & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
    r |= byte << (8 * i);
  }
  return r;
}

namespace dg_fp4 {
inline void cp_async16(uint32_t dst, const void* src, bool pred) {
  emu::Copy c{dst, src, 16, pred};
  if (emu::late) emu::open_group.push_back(c); else emu::do_copy(c);
}
inline void cp_async4(uint32_t dst, const void* src, bool pred) {
  emu::Copy c{dst, src, 4, pred};
  if (emu::late) emu::open_group.push_back(c); else emu::do_copy(c);
}
inline void cp_async_commit() {
  emu::groups.push_back(emu::open_group);
  emu::open_group.clear();
}
template <int N>
inline void cp_async_wait() {
  while (static_cast<int>(emu::groups.size()) > N) {
    for (const emu::Copy& c : emu::groups.front()) emu::do_copy(c);
    emu::groups.pop_front();
  }
}
inline uint4 lds128(uint32_t addr) {
  uint4 v;
  std::memcpy(&v, emu::smem.data() + addr, 16);
  return v;
}
inline uint32_t lds8(uint32_t addr) { return emu::smem[addr]; }
inline uint32_t add_shr6(uint32_t v, uint32_t mul) {  // mad.hi.u32 d, v, mul, v
  return static_cast<uint32_t>((static_cast<uint64_t>(v) * mul) >> 32) + v;
}
inline uint32_t mul_bf16x2(uint32_t x, uint32_t y) {
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const float p = emu::bf16_to_f(static_cast<uint16_t>(x >> (16 * h))) *
                    emu::bf16_to_f(static_cast<uint16_t>(y >> (16 * h)));
    r |= static_cast<uint32_t>(emu::f_to_bf16(p)) << (16 * h);
  }
  return r;
}
// mma.sync.m16n8k16 row.col f32.bf16.bf16.f32 with the PTX fragment layouts (lane = 4 * groupID + threadID).
inline void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                           uint32_t b1) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  emu::Lane& me = emu::lanes[threadIdx.x];
  me = emu::Lane{{a0, a1, a2, a3}, {b0, b1}, {c[0], c[1], c[2], c[3]}};
  emu::warp_bars[warp]->arrive_and_wait();
  const emu::Lane* w = &emu::lanes[warp * 32];
  auto half = [](uint32_t reg, int k) { return emu::bf16_to_f(static_cast<uint16_t>(reg >> (16 * (k & 1)))); };
  float d[4];
  for (int i = 0; i < 4; ++i) {
    const int row = (lane >> 2) + 8 * (i >> 1), col = 2 * (lane & 3) + (i & 1);
    double acc = me.c[i];
    for (int k = 0; k < 16; ++k) {
      const emu::Lane& la = w[4 * (row & 7) + ((k & 7) >> 1)];
      const float av = half(la.a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k);
      const emu::Lane& lb = w[4 * col + ((k & 7) >> 1)];
      const float bv = half(lb.b[k >= 8 ? 1 : 0], k);
      acc += static_cast<double>(av) * bv;
    }
    d[i] = static_cast<float>(acc);
  }
  emu::warp_bars[warp]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}
}  // namespace dg_fp4
