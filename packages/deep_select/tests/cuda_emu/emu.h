// CPU emulation of the CUDA features topk_radix_kernel.cuh uses, so the CPU tests run the kernel's exact code.
//
// One CTA at a time; its 512 threads are std::threads. __syncthreads is a block-wide std::barrier; warp
// shuffles / votes exchange values through a per-warp array between two per-warp barriers (every lane of a warp
// calls them in lockstep, as the kernel guarantees); shared-memory atomics are GCC atomics; cub::BlockScan is a
// shared array and two block barriers. Slow (thousands of OS-level barrier waits per row): tests use small rows.
#pragma once

#include <barrier>
#include <cstdint>
#include <cstring>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define DS_DYNAMIC_SMEM(name) uint32_t* name = emu::dyn_smem()

struct EmuDim {
  unsigned x;
};
inline thread_local EmuDim threadIdx{0};
inline thread_local EmuDim blockIdx{0};
struct uint4 {
  unsigned x, y, z, w;
};

namespace emu {
constexpr int kMaxThreads = 512;
inline std::barrier<>* block_bar = nullptr;
inline std::vector<std::barrier<>*> warp_bars;
inline int64_t warp_slots[kMaxThreads];
inline std::vector<uint32_t> dyn;
inline uint32_t* dyn_smem() { return dyn.data(); }

template <class T>
inline T warp_exchange(T v, int src) {  // every lane publishes v, then reads lane src's value
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  warp_slots[threadIdx.x] = bits;
  warp_bars[warp]->arrive_and_wait();
  T out;
  std::memcpy(&out, &warp_slots[warp * 32 + src], sizeof(T));
  warp_bars[warp]->arrive_and_wait();
  (void)lane;
  return out;
}

inline unsigned warp_ballot(bool p) {
  const int warp = threadIdx.x >> 5;
  warp_slots[threadIdx.x] = p ? 1 : 0;
  warp_bars[warp]->arrive_and_wait();
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m |= static_cast<unsigned>(warp_slots[warp * 32 + l] != 0) << l;
  warp_bars[warp]->arrive_and_wait();
  return m;
}
}  // namespace emu

inline void __syncthreads() { emu::block_bar->arrive_and_wait(); }
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  return emu::warp_exchange(v, src);
}
inline bool __all_sync(unsigned, bool p) { return emu::warp_ballot(p) == 0xffffffffu; }
inline unsigned __ballot_sync(unsigned, bool p) { return emu::warp_ballot(p); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float __uint_as_float(unsigned v) {
  float f;
  std::memcpy(&f, &v, sizeof(f));
  return f;
}
inline int __ffs(unsigned v) { return __builtin_ffs(static_cast<int>(v)); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __clz(unsigned v) { return v == 0 ? 32 : __builtin_clz(v); }
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
template <class T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
inline T max(T a, T b) {
  return a < b ? b : a;
}

namespace cub {
template <class T, int N>
struct BlockScan {
  struct TempStorage {
    T vals[N];
  };
  TempStorage& t;
  explicit BlockScan(TempStorage& ts) : t(ts) {}
  void ExclusiveSum(T in, T& out) {
    t.vals[threadIdx.x] = in;
    __syncthreads();
    T acc = 0;
    for (unsigned i = 0; i < threadIdx.x; ++i) acc += t.vals[i];
    out = acc;
    __syncthreads();
  }
};
}  // namespace cub
