// Gather ceilings for flash_mla's producer (session 14): how fast can one CTA per SM move 64-row tiles of indexed
// 1 KiB bf16 KV rows (the BF16 cache's rows) from L2 / HBM into shared memory, by each mechanism a producer could use?
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/micro/fm_gather_ceiling.cu -o build/gc
//   build/gc > result.json        (H200; prints one JSON object)
//
// Why: session 11 measured flash_mla's prefill producer alone at 3.7 TB/s (cp.async, L2-resident cache) and the
// consumers alone at 443 TFLOPS; at 1 KiB per row, 550 TFLOPS needs the gather at 4.3 TB/s. This measures the
// mechanisms alone (no consumers, ring of S tiles in flight per SM):
//   cpasync   16-byte cp.async.cg per thread (128 threads), the kernels' BF16 producer layout (128-byte swizzle)
//   cpasync4  the same, each warp instruction 4 rows x 128 bytes (FlashMLA's prefill producer layout)
//   ldg       ld.global.nc.v4 into registers (16 in flight per thread), then st.shared (register staging)
//   tma       one 2D TMA box [1 row, 64 dims] per 128-byte piece (512 per tile) with 128-byte swizzle, issued by the 32
//             lanes of one warp, completion by mbarrier transaction counts
//   bulk      one cp.async.bulk of a whole 1 KiB row (64 per tile; linear layout: not what wgmma reads, the fabric's
//             rate with the fewest instructions)
//   ldsum     ld.global.nc.v4 summed into registers (no shared memory): the L2 / HBM -> SM read rate itself
//   ldg4      ldg with cpasync4's mapping (4 rows x 128 bytes per warp instruction)
//   f8r1 / f8r4  584-byte FP8 rows (8-byte aligned) by 8-byte ld.global.nc summed into registers: one row per warp
//             instruction (lane l: bytes 8 l, 256 + 8 l, 512 + 8 l (l < 9); the FP8 producers' order) / 4 rows x 64
//             bytes per instruction (lane group g = lane / 8 a row, lane e: bytes 8 e + 64 k, k = 0..8); rows/s are
//             reported as TB/s of 584-byte rows
// and checks that a one-row TMA box lands in the exact swizzled layout the kernels' swz() writes (the swizzle phase
// comes from the shared-memory address, so a row written at offset 128 r gets phase r % 8).
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "micro_sm90.cuh"  // CK, su32, mbar_*, median_ms

constexpr int kRows = 64;         // rows per tile
constexpr int kRowBytes = 1024;   // bf16 [512]
constexpr int kTile = kRows * kRowBytes;
constexpr int kThreads = 128;

// chunk c (16 bytes, 0..63) of row r in a tile of 8 [64 rows, 128 B] sub-tiles, 128-byte swizzle (the kernels' swz)
__device__ __host__ __forceinline__ uint32_t swz(int r, int c) {
  return (uint32_t)((c >> 3) * kRows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void tma_row(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void bulk_row(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ uint2 ldg8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ldg16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

enum Method { kCpAsync = 0, kCpAsync4 = 1, kLdg = 2, kTma = 3, kBulk = 4, kLdSum = 5, kLdg4 = 6, kF8r1 = 7, kF8r4 = 8 };
constexpr int kF8Row = 584;

// One CTA per SM walks tiles blockIdx.x, + gridDim.x, ...; tile j goes to ring stage j % S. out[blockIdx.x]: a word
// that depends on the data (keeps every load live).
template <int M, int S>
__global__ void __launch_bounds__(kThreads, 1)
    gather(const uint8_t* kv, const int* idx, int n_tiles, uint32_t* out, const __grid_constant__ CUtensorMap map) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const uint32_t ring = (su32(smem) + 1023u) & ~1023u;
  const uint32_t bars = ring + S * kTile;
  if (t < S) mbar_init(bars + 8 * t, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  uint32_t acc = 0;
  int j = 0;
  for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x, ++j) {
    const int* ir = idx + (size_t)tile * kRows;
    const uint32_t st = ring + (j % S) * kTile;
    if constexpr (M == kCpAsync) {  // thread t: chunk t % 64 of rows t / 64 + 2 i
#pragma unroll 8
      for (int i = 0; i < kRows / 2; ++i) {
        const int r = (t >> 6) + 2 * i;
        cp16(st + swz(r, t & 63), kv + (size_t)__ldg(ir + r) * kRowBytes + (t & 63) * 16);
      }
      asm volatile("cp.async.commit_group;\n" ::);
      cp_wait<S - 1>();
    } else if constexpr (M == kCpAsync4) {  // warp: rows 4 warp + g (+16 i), lane group g = lane / 8, 128 B each
      const int g = lane >> 3, e = lane & 7;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = 4 * warp + g + 16 * i;
        const uint8_t* src = kv + (size_t)__ldg(ir + r) * kRowBytes + e * 16;
#pragma unroll
        for (int k = 0; k < 8; ++k) cp16(st + swz(r, 8 * k + e), src + 128 * k);
      }
      asm volatile("cp.async.commit_group;\n" ::);
      cp_wait<S - 1>();
    } else if constexpr (M == kLdg || M == kLdSum) {  // 16 loads in flight per thread, 2 batches
#pragma unroll 1
      for (int b = 0; b < 2; ++b) {
        uint4 v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int r = (t >> 6) + 2 * (16 * b + i);
          v[i] = ldg16(kv + (size_t)__ldg(ir + r) * kRowBytes + (t & 63) * 16);
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int r = (t >> 6) + 2 * (16 * b + i);
          if constexpr (M == kLdg) {
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(st + swz(r, t & 63)), "r"(v[i].x),
                         "r"(v[i].y), "r"(v[i].z), "r"(v[i].w)
                         : "memory");
          } else {
            acc ^= v[i].x + v[i].y + v[i].z + v[i].w;
          }
        }
      }
    } else if constexpr (M == kF8r1) {  // warp w: rows 16 w .. 16 w + 15, 4 at a time (12 loads in flight)
#pragma unroll 1
      for (int b = 0; b < 4; ++b) {
        uint2 v[4][3];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint8_t* src = kv + (size_t)__ldg(ir + 16 * warp + 4 * b + i) * kF8Row + 8 * lane;
          v[i][0] = ldg8(src);
          v[i][1] = ldg8(src + 256);
          v[i][2] = lane < 9 ? ldg8(src + 512) : make_uint2(0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) acc ^= v[i][0].x + v[i][0].y + v[i][1].x + v[i][1].y + v[i][2].x + v[i][2].y;
      }
    } else if constexpr (M == kF8r4) {  // rows 4 warp + g + 16 i (i = 0..3), bytes 8 e + 64 k (k = 0..8)
      const int g = lane >> 3, e = lane & 7;
#pragma unroll 1
      for (int b = 0; b < 2; ++b) {
        uint2 v[2][9];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint8_t* src = kv + (size_t)__ldg(ir + 4 * warp + g + 16 * (2 * b + i)) * kF8Row + 8 * e;
#pragma unroll
          for (int k = 0; k < 9; ++k) v[i][k] = ldg8(src + 64 * k);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int k = 0; k < 9; ++k) acc ^= v[i][k].x + v[i][k].y;
      }
    } else if constexpr (M == kLdg4) {  // rows 4 warp + g + 16 i, chunks 8 k + e; 16 loads in flight (2 rows)
      const int g = lane >> 3, e = lane & 7;
#pragma unroll 1
      for (int b = 0; b < 2; ++b) {
        uint4 v[16];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint8_t* src = kv + (size_t)__ldg(ir + 4 * warp + g + 16 * (2 * b + i)) * kRowBytes + e * 16;
#pragma unroll
          for (int k = 0; k < 8; ++k) v[8 * i + k] = ldg16(src + 128 * k);
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int r = 4 * warp + g + 16 * (2 * b + i / 8);
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(st + swz(r, 8 * (i % 8) + e)), "r"(v[i].x),
                       "r"(v[i].y), "r"(v[i].z), "r"(v[i].w)
                       : "memory");
        }
      }
    } else {  // kTma / kBulk: warp 0 only; stage j % S reused after its previous fill landed
      if (warp == 0) {
        const uint32_t bar = bars + 8 * (j % S);
        if (j >= S) mbar_wait(bar, ((j / S) - 1) & 1);
        if (lane == 0) mbar_expect(bar, kTile);
        __syncwarp();
        const int r0 = lane, r1 = lane + 32;  // each lane: 2 rows
        const int row0 = __ldg(ir + r0), row1 = __ldg(ir + r1);
        if constexpr (M == kTma) {
#pragma unroll
          for (int c = 0; c < 8; ++c) {
            tma_row(st + c * kRows * 128 + r0 * 128, &map, 64 * c, row0, bar);
            tma_row(st + c * kRows * 128 + r1 * 128, &map, 64 * c, row1, bar);
          }
        } else {
          bulk_row(st + r0 * kRowBytes, kv + (size_t)row0 * kRowBytes, kRowBytes, bar);
          bulk_row(st + r1 * kRowBytes, kv + (size_t)row1 * kRowBytes, kRowBytes, bar);
        }
      }
    }
  }
  if constexpr (M == kCpAsync || M == kCpAsync4) cp_wait<0>();
  if constexpr (M == kTma || M == kBulk) {
    if (warp == 0 && j > 0) {  // drain: the last min(j, S) fills
      for (int q = (j > S ? j - S : 0); q < j; ++q) mbar_wait(bars + 8 * (q % S), (q / S) & 1);
    }
  }
  __syncthreads();
  if constexpr (M != kLdSum && M != kF8r1 && M != kF8r4)
    acc = *reinterpret_cast<const uint32_t*>(smem + (ring - su32(smem)) + 4 * t);
  if (acc == 0x12345679u) out[blockIdx.x] = acc;  // practically never: keeps the loads live
}

// Layout check: one tile (rows idx[0..63]) by method M into stage 0, then the 64 KiB stage copied out.
template <int M>
__global__ void __launch_bounds__(kThreads, 1)
    check(const uint8_t* kv, const int* idx, uint8_t* dump, const __grid_constant__ CUtensorMap map) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int t = threadIdx.x;
  const uint32_t ring = (su32(smem) + 1023u) & ~1023u;
  uint8_t* ring_p = smem + (ring - su32(smem));
  const uint32_t bar = ring + kTile;
  if (t == 0) mbar_init(bar, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  if (t < 32) {
    if (t == 0) mbar_expect(bar, kTile);
    __syncwarp();
    for (int r = t; r < kRows; r += 32) {
      const int row = idx[r];
      for (int c = 0; c < 8; ++c) tma_row(ring + c * kRows * 128 + r * 128, &map, 64 * c, row, bar);
    }
    mbar_wait(bar, 0);
  }
  __syncthreads();
  for (int i = t; i < kTile / 16; i += kThreads)
    reinterpret_cast<uint4*>(dump)[i] = reinterpret_cast<const uint4*>(ring_p)[i];
}

using EncodeFn = PFN_cuTensorMapEncodeTiled_v12000;
static EncodeFn encode_fn() {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
  return reinterpret_cast<EncodeFn>(f);
}
// bf16 [n_rows, 512] at 1 KiB per row, box [1 row, 64 dims], 128-byte swizzle
static CUtensorMap make_map(const void* kv, int64_t n_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {512, (cuuint64_t)n_rows}, strides[1] = {kRowBytes};
  const cuuint32_t box[2] = {64, 1}, elem[2] = {1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(kv), dims, strides, box,
                                 elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
    std::exit(1);
  }
  return m;
}

template <int M, int S>
static double run(const uint8_t* kv, const int* idx, int n_tiles, uint32_t* out, const CUtensorMap& map, int n_sm) {
  const int smem = S * kTile + 1024 + 64;
  auto k = gather<M, S>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const float ms = median_ms([&] { k<<<n_sm, kThreads, smem>>>(kv, idx, n_tiles, out, map); });
  return (double)n_tiles * kTile / (ms * 1e-3) / 1e12;  // TB/s
}

int main() {
  int n_sm = 0;
  CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
  const int n_tiles = n_sm * 240;
  std::mt19937 rng(14);
  uint32_t* out;
  CK(cudaMalloc(&out, 4096 * 4));
  std::printf("{\"sms\": %d, \"tiles\": %d, \"rows_per_tile\": %d, \"row_bytes\": %d, \"cases\": [\n", n_sm, n_tiles,
              kRows, kRowBytes);
  const int64_t sizes[2] = {1152, 1 << 21};  // the prefill benchmark's cache (1.2 MB, L2) / 2 GiB (HBM)
  bool first = true;
  for (int64_t n_rows : sizes) {
    uint8_t* kv;
    int* idx;
    CK(cudaMalloc(&kv, (size_t)n_rows * kRowBytes));
    CK(cudaMalloc(&idx, (size_t)n_tiles * kRows * 4));
    std::vector<uint16_t> hv((size_t)std::min<int64_t>(n_rows, 4096) * 512);
    for (auto& x : hv) x = (uint16_t)rng();
    for (int64_t r0 = 0; r0 < n_rows; r0 += 4096) {
      const int64_t n = std::min<int64_t>(4096, n_rows - r0);
      CK(cudaMemcpy(kv + r0 * kRowBytes, hv.data(), n * kRowBytes, cudaMemcpyHostToDevice));
    }
    std::vector<int> hi((size_t)n_tiles * kRows);
    std::uniform_int_distribution<int> pick(0, (int)n_rows - 1);
    for (auto& x : hi) x = pick(rng);
    CK(cudaMemcpy(idx, hi.data(), hi.size() * 4, cudaMemcpyHostToDevice));
    const CUtensorMap map = make_map(kv, n_rows);
    // layout check of the TMA path (once, on the first cache)
    if (first) {
      uint8_t* dump;
      CK(cudaMalloc(&dump, kTile));
      CK(cudaFuncSetAttribute(check<kTma>, cudaFuncAttributeMaxDynamicSharedMemorySize, kTile + 1024 + 64));
      check<kTma><<<1, kThreads, kTile + 1024 + 64>>>(kv, idx, dump, map);
      CK(cudaDeviceSynchronize());
      std::vector<uint8_t> hd(kTile), hrow(kRowBytes);
      CK(cudaMemcpy(hd.data(), dump, kTile, cudaMemcpyDeviceToHost));
      int bad = 0;
      for (int r = 0; r < kRows; ++r) {
        CK(cudaMemcpy(hrow.data(), kv + (size_t)hi[r] * kRowBytes, kRowBytes, cudaMemcpyDeviceToHost));
        for (int c = 0; c < 64; ++c)
          for (int b = 0; b < 16; ++b) bad += hd[swz(r, c) + b] != hrow[16 * c + b];
      }
      std::printf("  {\"check\": \"tma one-row boxes land in swz() layout\", \"bad_bytes\": %d},\n", bad);
      CK(cudaFree(dump));
      first = false;
    }
    const char* names[9] = {"cpasync", "cpasync4", "ldg", "tma", "bulk", "ldsum", "ldg4", "f8r1", "f8r4"};
    double r[9][2];
    r[kCpAsync][0] = run<kCpAsync, 2>(kv, idx, n_tiles, out, map, n_sm);
    r[kCpAsync][1] = run<kCpAsync, 3>(kv, idx, n_tiles, out, map, n_sm);
    r[kCpAsync4][0] = run<kCpAsync4, 2>(kv, idx, n_tiles, out, map, n_sm);
    r[kCpAsync4][1] = run<kCpAsync4, 3>(kv, idx, n_tiles, out, map, n_sm);
    r[kLdg][0] = r[kLdg][1] = run<kLdg, 1>(kv, idx, n_tiles, out, map, n_sm);
    r[kTma][0] = run<kTma, 2>(kv, idx, n_tiles, out, map, n_sm);
    r[kTma][1] = run<kTma, 3>(kv, idx, n_tiles, out, map, n_sm);
    r[kBulk][0] = run<kBulk, 2>(kv, idx, n_tiles, out, map, n_sm);
    r[kBulk][1] = run<kBulk, 3>(kv, idx, n_tiles, out, map, n_sm);
    r[kLdSum][0] = r[kLdSum][1] = run<kLdSum, 1>(kv, idx, n_tiles, out, map, n_sm);
    r[kLdg4][0] = r[kLdg4][1] = run<kLdg4, 1>(kv, idx, n_tiles, out, map, n_sm);
    // FP8 rows: the same indices into the same buffer read as 584-byte rows (rows < n_rows * 1024 / 584 stay inside)
    r[kF8r1][0] = r[kF8r1][1] = run<kF8r1, 1>(kv, idx, n_tiles, out, map, n_sm) * kF8Row / kRowBytes;
    r[kF8r4][0] = r[kF8r4][1] = run<kF8r4, 1>(kv, idx, n_tiles, out, map, n_sm) * kF8Row / kRowBytes;
    for (int m = 0; m < 9; ++m) {
      std::printf("  {\"cache_rows\": %lld, \"method\": \"%s\", \"tb_s_2_stages\": %.3f, \"tb_s_3_stages\": %.3f}%s\n",
                  (long long)n_rows, names[m], r[m][0], r[m][1], (n_rows == sizes[1] && m == 8) ? "" : ",");
    }
    CK(cudaFree(kv));
    CK(cudaFree(idx));
  }
  std::printf("]}\n");
  return 0;
}
