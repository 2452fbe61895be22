// Tensor-pipe ceilings of the FP8 GEMM tile shapes on this GPU (issue 6: "say which goal misses and why").
//
// One persistent CTA per SM runs `iters` 128-deep k blocks of one output tile from operands that stay in shared
// memory (no global A / B traffic), in the shapes the FP8 GEMMs use:
//   N = 128: tile 128 x 128, two consumer warpgroups each m64n128 (fp8_db, DeepGEMM's common tile, CUTLASS 128x128);
//   N = 256: tile 128 x 256, two consumer warpgroups each m64n256 (a cuBLAS-style tile: 128 accumulators per thread,
//            no room for a second promotion set).
// WIDE (N = 256): the 128 x 256 tile WITH two-level accumulation in 232 registers (consume_wide): acc[128] and one
//   temporary; per k block each n128 half is issued, waited for and promoted (acc += tmp * sa[row] * sb[half]) in
//   turn.
// DB: fp8_db's consumers themselves (db_tile, spin waits) with an ideal producer, without / with the feed.
// FEED: a producer thread streams one stage's bytes per k block ((128 + N) x 128 B, what the real kernels' TMA
//   writes) from an L2-resident global buffer into a ring of shared-memory slots with cp.async.bulk; the consumers
//   wait for a slot's full barrier before each k block and release it after, exactly the real pipeline's coupling,
//   but the wgmmas keep reading the resident tile (so only the shared-memory WRITE traffic and the barriers are added).
// The ladder separates the tensor ceiling of each tile shape, the cost of the feed (its shared-memory writes and
// the L2 -> SM bytes per FLOP) and the cost of promotion in the wide tile.
#include <cuda_runtime.h>

#include <cstdint>

#include "../../csrc/cuda/dg_fp8_db.cuh"  // gmma_desc, wgmma m64n128k32 (+ first), mbarriers, wg_* fences
#include "wgmma_n256.cuh"

namespace {

using namespace dg_fp8db;

constexpr int kFeedSlots = 3;

// Keeps N accumulators live through ptxas (an empty asm statement vanishes in the PTX, so ptxas would delete the
// FFMAs / wgmmas feeding them): each consumer thread stores them to shared memory at the end (the operand tiles are
// not read any more; N * 256 * 4 bytes fit in them). `sink` stays unused (the kernels' common signature).
template <int N>
__device__ __forceinline__ void keep_live(const float* acc, uint8_t* smem) {
  float* dst = reinterpret_cast<float*>(smem) + (threadIdx.x - 128);
#pragma unroll
  for (int i = 0; i < N; ++i) dst[256 * i] = acc[i];
}

template <int N>
struct CeilLayout {
  static constexpr int kA = 0;                          // e4m3 [128, 128] (two warpgroups' 64-row halves)
  static constexpr int kB = 128 * 128;                  // e4m3 [N, 128]
  static constexpr int kSc = kB + N * 128;              // fp32 [128] A scales + B scale
  static constexpr int kFeed = kSc + 1024;              // kFeedSlots x stage bytes (written by the feed only)
  static constexpr int kStageBytes = (128 + N) * 128;   // one k block of A and B
  static constexpr int kBar = kFeed + kFeedSlots * kStageBytes;
  static constexpr int kBytes = kBar + 64 + 1024;       // + barriers + 1 KiB alignment slack
};

__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// Producer thread: kFeedSlots-deep ring, one stage of bytes per k block.
template <int N>
__device__ void feed(uint8_t* smem, const uint8_t* src, uint64_t src_bytes, int iters) {
  using L = CeilLayout<N>;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kFeedSlots;
  uint64_t off = (uint64_t)blockIdx.x * 65536 % src_bytes;
  for (int it = 0; it < iters; ++it) {
    const int s = it % kFeedSlots;
    if (it >= kFeedSlots) mbar_wait(&empty[s], (uint32_t)((it / kFeedSlots - 1) & 1));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&full[s])),
                 "r"((uint32_t)L::kStageBytes)
                 : "memory");
    if (off + L::kStageBytes > src_bytes) off = 0;
    bulk_g2s(smem_u32(smem + L::kFeed + s * L::kStageBytes), src + off, L::kStageBytes, &full[s]);
    off += L::kStageBytes;
  }
}

// The consumers' position in the feed ring: slot and phase advanced by one per k block (no division in the loop:
// the register budget of the 128 x 256 consumers is tight).
struct Ring {
  int slot = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next() {
    if (++slot == kFeedSlots) {
      slot = 0;
      phase ^= 1u;
    }
  }
};

// A plain spin on the full barrier: the kernels' watchdog wait (mbar_wait, a poll counter and a trap) costs the 128 x
// 256 consumers ~30 registers in ptxas's allocation and made them spill (77 spill stores); nothing here can deadlock
// short of a launch error.
template <int N, bool FEED>
__device__ __forceinline__ void wait_stage(uint8_t* smem, const Ring& r) {
  if constexpr (FEED) {
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + CeilLayout<N>::kBar);
    while (!dg_w4a8::mbar_try_wait(&full[r.slot], r.phase)) {
    }
  }
}
template <int N, bool FEED>
__device__ __forceinline__ void release_stage(uint8_t* smem, int slot) {
  if constexpr (FEED) {
    uint64_t* empty = reinterpret_cast<uint64_t*>(smem + CeilLayout<N>::kBar) + kFeedSlots;
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(&empty[slot]);
  }
}

// No promotion: every k block accumulates into acc (N / 2 registers), at most two commit groups in flight.
template <int N, bool FEED>
__device__ void consume_plain(uint8_t* smem, int iters, int cw, float* sink) {
  using L = CeilLayout<N>;
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  const uint32_t a_base = smem_u32(smem + L::kA) + cw * 64 * 128, b_base = smem_u32(smem + L::kB);
  Ring ring;
  int prev = 0;  // slot of the previous k block
  for (int it = 0; it < iters; ++it) {
    wait_stage<N, FEED>(smem, ring);
    wg_arrive();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (N == 128) {
        wgmma_m64n128k32_e4m3(acc, gmma_desc(a_base + 32 * j), gmma_desc(b_base + 32 * j), 1);
      } else {
        wgmma_m64n256k32_e4m3(acc, gmma_desc(a_base + 32 * j), gmma_desc(b_base + 32 * j));
      }
    }
    wg_commit();
    wg_wait1();
    if (it > 0) release_stage<N, FEED>(smem, prev);  // block it - 1 is done
    prev = ring.slot;
    ring.next();
  }
  wg_wait0();
  if (iters > 0) release_stage<N, FEED>(smem, prev);
  keep_live<N / 2>(acc, smem);
}

// The 128 x 256 tile with promotion inside 232 registers (the fp8_wide design): acc[128] (two n128 halves) and ONE
// temporary tmp[64]; per k block and half: four m64n128k32 into tmp (scale-d 0 first), wait_group 0, acc half +=
// tmp * (sa[row] * sb[half]). No wgmma of this warpgroup is in flight during its promotions: the other consumer
// warpgroup's wgmmas are what keeps the tensor pipe busy then.
template <bool FEED>
__device__ void consume_wide(uint8_t* smem, int iters, int cw, int wtid, float* sink) {
  using L = CeilLayout<256>;
  float acc[128], t[64];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) t[i] = 0.f;
  const uint32_t a_base = smem_u32(smem + L::kA) + cw * 64 * 128, b_base = smem_u32(smem + L::kB);
  const float* sc = reinterpret_cast<const float*>(smem + L::kSc);
  const int r0 = 64 * cw + 16 * (wtid >> 5) + ((wtid & 31) >> 2);
  Ring ring;
  for (int it = 0; it < iters; ++it) {
    wait_stage<256, FEED>(smem, ring);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t bh = b_base + h * 128 * 128;
      wg_arrive();
      // Read-write operands ("+f") with scale-d 0 on the first step: t keeps ONE register block for both halves (the
      // write-only form lets ptxas give each half its own 64 registers: acc + 2 x 64 > 232, spills).
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_m64n128k32_e4m3(t, gmma_desc(a_base + 32 * j), gmma_desc(bh + 32 * j), j > 0);
      wg_commit();
      const float s0 = sc[r0] * sc[128 + h], s1 = sc[r0 + 8] * sc[128 + h];
      wg_wait0();
      reg_fence<64>(t);
      if (h == 1) release_stage<256, FEED>(smem, ring.slot);  // the stage's last reads are done
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        acc[64 * h + 4 * j + 0] = fmaf(t[4 * j + 0], s0, acc[64 * h + 4 * j + 0]);
        acc[64 * h + 4 * j + 1] = fmaf(t[4 * j + 1], s0, acc[64 * h + 4 * j + 1]);
        acc[64 * h + 4 * j + 2] = fmaf(t[4 * j + 2], s1, acc[64 * h + 4 * j + 2]);
        acc[64 * h + 4 * j + 3] = fmaf(t[4 * j + 3], s1, acc[64 * h + 4 * j + 3]);
      }
    }
    ring.next();
  }
  keep_live<128>(acc, smem);
}

// fp8_db's own consumers (db_tile<4, kSpin>: two temporaries, promotion with the stage's scales, stage release) on
// a DbLayout<4> ring that one producer thread fills: with FEED one cp.async.bulk of a whole stage (A, B and scale
// bytes) from the L2-resident buffer, else a bare arrive. fp8_db's consumer side with an ideal producer.
using DbL = DbLayout<4>;

template <bool FEED>
__device__ void db_feed(uint8_t* smem, const uint8_t* src, uint64_t src_bytes, int iters) {
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + DbL::kBar);
  uint64_t off = (uint64_t)blockIdx.x * 65536 % src_bytes;
  for (int it = 0; it < iters; ++it) {
    const int s = it % 4;
    if (it >= 4) mbar_wait(&full[4 + s], (uint32_t)((it / 4 - 1) & 1));  // empty[s]
    if constexpr (FEED) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&full[s])),
                   "r"((uint32_t)DbL::kStage)
                   : "memory");
      if (off + DbL::kStage > src_bytes) off = 0;
      bulk_g2s(smem_u32(smem + s * DbL::kStage), src + off, DbL::kStage, &full[s]);
      off += DbL::kStage;
    } else {
      mbar_arrive(&full[s]);
    }
  }
}

template <bool FEED>
__device__ __forceinline__ void db_body(const uint8_t* src, uint64_t src_bytes, int iters) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x;
  for (int i = tid; i < 4 * DbL::kStage / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(smem)[i] = 0x38383838u;
  if (tid == 0) {
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + DbL::kBar);
    for (int s = 0; s < 4; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&full[4 + s], 8);  // one arrive per consumer warp (db_finish)
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  fence_async_smem();
  __syncthreads();
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 0) db_feed<FEED>(smem, src, src_bytes, iters);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    float acc[64], ta[64], tb[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    db_tile<4, true>(acc, ta, tb, smem, 0, iters, (tid - 128) >> 7, (tid - 128) & 127);
    keep_live<64>(acc, smem);
  }
}

template <int N, bool FEED, bool WIDE = false>
__device__ void ceiling_body(const uint8_t* src, uint64_t src_bytes, int iters, float* sink) {
  using L = CeilLayout<N>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x;
  // Operands: e4m3 0x38 = 1.0 (A, B); scales 1.0. The values do not change the tensor pipe's speed.
  for (int i = tid; i < L::kSc / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(smem)[i] = 0x38383838u;
  for (int i = tid; i < 256; i += blockDim.x) reinterpret_cast<float*>(smem + L::kSc)[i] = 1.f;
  if (tid == 0) {
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
    for (int s = 0; s < kFeedSlots; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&full[kFeedSlots + s], 8);  // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  fence_async_smem();  // the generic-proxy operand writes -> the wgmmas' async-proxy reads
  __syncthreads();
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (FEED && tid == 0) feed<N>(smem, src, src_bytes, iters);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int cw = (tid - 128) >> 7;
  if constexpr (WIDE) {
    consume_wide<FEED>(smem, iters, cw, (tid - 128) & 127, sink);
  } else {
    consume_plain<N, FEED>(smem, iters, cw, sink);
  }
}

}  // namespace

#define CEILING_KERNEL(NAME, BODY)                                                                                  \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                              \
      NAME(const uint8_t* src, unsigned long long src_bytes, int iters, float* sink) {                             \
    BODY(src, src_bytes, iters, sink);                                                                              \
  }

CEILING_KERNEL(ceil_n128, (ceiling_body<128, false>))
CEILING_KERNEL(ceil_n256, (ceiling_body<256, false>))
CEILING_KERNEL(ceil_n128_feed, (ceiling_body<128, true>))
CEILING_KERNEL(ceil_n256_feed, (ceiling_body<256, true>))
CEILING_KERNEL(ceil_wide, (ceiling_body<256, false, true>))
CEILING_KERNEL(ceil_wide_feed, (ceiling_body<256, true, true>))

extern "C" __global__ void __launch_bounds__(384, 1)
    ceil_db(const uint8_t* src, unsigned long long src_bytes, int iters, float*) {
  db_body<false>(src, src_bytes, iters);
}
extern "C" __global__ void __launch_bounds__(384, 1)
    ceil_db_feed(const uint8_t* src, unsigned long long src_bytes, int iters, float*) {
  db_body<true>(src, src_bytes, iters);
}

// Dynamic shared-memory bytes of each layout (read by the driver instead of repeating the formulas):
// out[0] = N 128 kernels, out[1] = N 256 kernels, out[2] = the fp8_db-consumer kernels.
extern "C" __global__ void ceil_sizes(int* out) {
  out[0] = CeilLayout<128>::kBytes;
  out[1] = CeilLayout<256>::kBytes;
  out[2] = DbL::kBar + 16 * 4 + 1024;
}
