// DSMEM exchange cost for a dims-split flash_mla prefill (NOTES "Next session (after session 14)", item 2): two CTAs
// of a cluster each hold half of Q and half of every KV row, so each computes a partial S [64 heads x 64 keys] fp32
// per tile and needs its partner's before the softmax. How long does that hand-over take, per tile, when it is the
// only thing a CTA does?
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/micro/fm_dsmem_exchange.cu -o build/dx
//   build/dx > result.json        (H200; prints one JSON object)
//
// Written in session 14; run in session 15 (H200, benchmarks/results/2026-12-01-s15-fm_dsmem_exchange.json): 792.8 ns
// per tile with 1 slot, 843.9 / 843.3 with 2 / 4 (bandwidth-bound, ~20 GB/s per SM and direction): a dims-split
// prefill pair pays only with the exchange hidden behind later tiles' scores (flash_mla README, the prefill goal).
//
// Per tile t, each of the 128 threads of a CTA holds 32 fp32 (a 64 x 64 fp32 tile: 16 KiB per CTA). It pushes them
// into its partner's receive slot t % NB with st.async (completion counted in bytes on the partner's full[slot]
// mbarrier), waits for its own full[slot] (the partner's 16 KiB), adds them to its own values (the partial-S sum the
// softmax needs), then tells the partner the slot is free again (a remote arrive on the partner's empty[slot]).
// NB = 1: every tile waits a full round trip (the dependent exchange a softmax needs); NB = 2 / 4: the sends run up to
// NB tiles ahead (an upper bound for a pipeline that overlaps other tiles' work with the hand-over).
// Reported: ns per tile (median of 10 launches after 3 warm-ups), with 66 clusters of 2 CTAs (one CTA per SM).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "micro_sm90.cuh"  // CK, su32, mbar_*, median_ms

constexpr int kThreads = 128;
constexpr int kVals = 32;                       // fp32 per thread
constexpr int kSlotBytes = kThreads * kVals * 4;  // 16 KiB

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The shared::cluster address of this CTA's shared address a in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t mapa(uint32_t a, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// One arrival on an mbarrier of another CTA of the cluster (cluster address).
__device__ __forceinline__ void mbar_arrive_remote(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
}
// 16 bytes into another CTA's shared memory; completion counted on that CTA's mbarrier (cluster addresses).
__device__ __forceinline__ void st_async16(uint32_t dst, float4 v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                   dst),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
               : "memory");
}

// smem: recv[NB][kSlotBytes], full[NB] (bytes from the partner; one local expect_tx per phase), empty[NB] (128
// remote arrivals: the partner has read the slot this CTA writes into).
template <int NB>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1) exchange(int tiles, float* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int t = threadIdx.x;
  const uint32_t recv = su32(smem), full = recv + NB * kSlotBytes, empty = full + 8 * NB;
  const uint32_t peer = cluster_rank() ^ 1u;
  if (t < NB) {
    mbar_init(full + 8 * t, 1);
    mbar_init(empty + 8 * t, kThreads);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  cluster_sync();  // both CTAs' barriers initialised before any remote access
  float v[kVals];
#pragma unroll
  for (int i = 0; i < kVals; ++i) v[i] = (float)(t + i) * 1e-3f;
  const uint32_t peer_recv = mapa(recv, peer), peer_full = mapa(full, peer), peer_empty = mapa(empty, peer);
  for (int j = 0; j < tiles; ++j) {
    const int s = j % NB;
    const uint32_t ph = (uint32_t)(j / NB) & 1u;
    if (t == 0) mbar_expect(full + 8 * s, kSlotBytes);  // this phase of my full[s]: the partner's 16 KiB
    if (j >= NB) mbar_wait<true>(empty + 8 * s, ph ^ 1u);  // the partner has read my last write into its slot s
#pragma unroll
    for (int i = 0; i < kVals / 4; ++i) {
      st_async16(peer_recv + s * kSlotBytes + (i * kThreads + t) * 16,
                 make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]), peer_full + 8 * s);
    }
    mbar_wait<true>(full + 8 * s, ph);  // the partner's partial S has landed in my slot s
    const float4* r = reinterpret_cast<const float4*>(smem + s * kSlotBytes);
#pragma unroll
    for (int i = 0; i < kVals / 4; ++i) {
      const float4 w = r[i * kThreads + t];
      v[4 * i] += w.x * 1e-6f, v[4 * i + 1] += w.y * 1e-6f, v[4 * i + 2] += w.z * 1e-6f, v[4 * i + 3] += w.w * 1e-6f;
    }
    mbar_arrive_remote(peer_empty + 8 * s);  // my slot s is free for the partner's next write
  }
  cluster_sync();  // no CTA exits while its partner may still write into it
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kVals; ++i) acc += v[i];
  if (acc == 12345.678f) out[blockIdx.x] = acc;  // keeps the values live
}

template <int NB>
static double run(int n_ctas, int tiles, float* out) {
  const int smem = NB * kSlotBytes + 16 * NB;
  CK(cudaFuncSetAttribute(exchange<NB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const float ms = median_ms([&] { exchange<NB><<<n_ctas, kThreads, smem>>>(tiles, out); });
  return ms * 1e6 / tiles;  // ns per tile
}

int main() {
  int n_sm = 0;
  CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
  const int n_ctas = n_sm / 2 * 2, tiles = 20000;
  float* out;
  CK(cudaMalloc(&out, 4096 * 4));
  const double ns1 = run<1>(n_ctas, tiles, out), ns2 = run<2>(n_ctas, tiles, out), ns4 = run<4>(n_ctas, tiles, out);
  std::printf("{\"ctas\": %d, \"cluster\": 2, \"tiles\": %d, \"bytes_per_tile_each_way\": %d, "
              "\"ns_per_tile\": {\"slots_1\": %.1f, \"slots_2\": %.1f, \"slots_4\": %.1f}}\n",
              n_ctas, tiles, kSlotBytes, ns1, ns2, ns4);
  return 0;
}
