// Host entry points of the CUTLASS dense FP8 block-scaled GEMM (torch-free: raw device pointers as integers).
//
// D[m, n] (bf16, row-major) = beta * C[m, n] (bf16) + sum_kb sfa[kb, i] * sfb[j/128, kb] * (A[i, kb] . B[j, kb])
//   A   e4m3 [m, k] row-major            B   e4m3 [n, k] row-major (K-major, "nt")
//   sfa fp32, one of two layouts (fixed per config, see the table below):
//     M-major [k/128, sfa_ld]: the transpose of the API's [m, k/128], rows padded to sfa_ld >= m, sfa_ld % 4 == 0 so
//       each row is 16-byte aligned for TMA; the kernel sees M extent sfa_ld, and columns >= m only scale
//       accumulator rows that are never stored;
//     K-major [m, k/128]: the API layout as is (loaded by cp.async with M-bounds predicates; sfa_ld is ignored).
//   sfb fp32 [ceil(n/128), k/128] row-major (the API layout as is)
// Requirements (checked in Python, re-checked by CUTLASS can_implement): k % 128 == 0, n % 8 == 0, 16-byte
// aligned base pointers.
// Configs (index: tile, schedule, cluster, tile scheduler, A-scale layout):
//   0: 128x128x128 cooperative, 1x2, stream-K,   M-major     1: 64x128x128 ping-pong, 1x1, persistent, M-major
//   2: 128x128x128 cooperative, 1x2, stream-K,   K-major     3: 128x128x128 cooperative, 2x1, stream-K, K-major
//   4: 64x128x128 ping-pong, 1x1, persistent,    K-major     5: 128x128x128 cooperative, 2x2, stream-K, K-major
// (No N = 64 tile: the B scales' 128-wide N blocks must divide the tile; no 128x256 / 256x128 tile: the collective
// keeps two fp32 accumulators per warpgroup, 2 x 128 registers per thread, over the 255-register limit.)
// Tile-scheduler knobs (runtime, no extra instantiation): raster 0 heuristic / 1 along M / 2 along N, swizzle 1, 2,
// 4 or 8; stream-K configs only: decomposition 0 heuristic / 1 data-parallel / 2 split-K / 3 stream-K, splits
// (split-K factor). The persistent (ping-pong) scheduler ignores decomposition and splits.
#pragma once

#include <cstdint>

namespace dg {

constexpr int kCutlassFp8Configs = 6;

struct CutlassFp8Args {
  uintptr_t a, sfa, b, sfb, c, d;  // device pointers; c may equal d (beta == 0 means C is never read)
  int m, n, k, sfa_ld;
  float beta;
  uintptr_t workspace;  // device buffer of cutlass_fp8_workspace_size() bytes (may be 0 when that is 0)
  uintptr_t stream;     // cudaStream_t
  int raster = 0, swizzle = 1, decomposition = 0, splits = 1;  // tile-scheduler knobs (see above)
};

// Bytes of global workspace the kernel needs for args' m, n, k and scheduler knobs (stream-K partials; pointers
// are ignored); throws std::invalid_argument on a bad config or knob.
int64_t cutlass_fp8_workspace_size(int config, const CutlassFp8Args& args);
// Launches asynchronously on args.stream; throws std::runtime_error when CUTLASS rejects the problem.
void cutlass_fp8_gemm(int config, const CutlassFp8Args& args);

// Per-config entry points (one translation unit each, to keep compile time and memory per TU small).
#define DG_CUTLASS_FP8_CONFIG(name)                                    \
  int64_t cutlass_fp8_workspace_size_##name(const CutlassFp8Args& args); \
  void cutlass_fp8_gemm_##name(const CutlassFp8Args& args);
DG_CUTLASS_FP8_CONFIG(coop)        // 0
DG_CUTLASS_FP8_CONFIG(pingpong)    // 1
DG_CUTLASS_FP8_CONFIG(coop_k)      // 2
DG_CUTLASS_FP8_CONFIG(coop_k_2x1)  // 3
DG_CUTLASS_FP8_CONFIG(pingpong_k)  // 4
DG_CUTLASS_FP8_CONFIG(coop_k_2x2)  // 5
#undef DG_CUTLASS_FP8_CONFIG

}  // namespace dg

// M-grouped FP8 GEMM (fp8_grouped_kernel.cuh; one fp8_grouped_<name>.cu per config), two layouts:
//   contiguous (masked == 0): out[i, :] = dequant(a[i]) @ dequant(b[m_indices[i]])^T for 0 <= m_indices[i] < groups,
//     0 for other rows (padding -1); a e4m3 [rows, k], sfa fp32 [rows, k/128] (K-major, the API layout),
//     d bf16 [rows, n], m_indices int32 [rows]; each expert's rows must be contiguous (an expert with several runs
//     of rows gets NaN rows instead);
//   masked (masked == 1): a [groups, m_max, k], sfa [groups, m_max, k/128], d [groups, m_max, n], m_indices holds
//     masked_m int32 [groups]; expert e's rows i < masked_m[e] (clamped to [0, m_max]) computed, the others untouched;
//   both: b e4m3 [groups, n, k], sfb fp32 [groups, ceil(n/128), k/128], k % 128 == 0, n % 8 == 0.
// Configs (index: tile, schedule, cluster):
//   0: 128x128x128 cooperative, 1x2    1: 128x128x128 cooperative, 2x1
//   2: 64x128x128 ping-pong, 1x1       3: 128x128x128 cooperative, 1x1
//   4: 128x128x128 cooperative, 2x2
// Scheduler knobs (runtime): raster 0/1 along M (CUTLASS's grouped default), 2 along N; swizzle 1, 2, 4 or 8.
namespace dg {
constexpr int kCutlassFp8GroupedConfigs = 5;

struct CutlassFp8GroupedArgs {
  uintptr_t a, sfa, b, sfb, d, m_indices;  // m_indices: the row ids (contiguous) or masked_m (masked)
  int rows, n, k, groups;                  // rows: of a (contiguous) or groups * m_max (masked)
  uintptr_t aux;        // device buffer of cutlass_fp8_grouped_aux_bytes(config, groups) bytes (per-expert arrays)
  uintptr_t workspace;  // device buffer of cutlass_fp8_grouped_workspace_size(config, groups) bytes
  uintptr_t stream;     // cudaStream_t
  int masked = 0, m_max = 0;
  int config = 0, raster = 0, swizzle = 1;
};
int64_t cutlass_fp8_grouped_aux_bytes(int config, int groups);
int64_t cutlass_fp8_grouped_workspace_size(int config, int groups);
void cutlass_fp8_grouped_gemm(const CutlassFp8GroupedArgs& args);

#define DG_CUTLASS_FP8_GROUPED_CONFIG(name)                         \
  int64_t cutlass_fp8_grouped_aux_bytes_##name(int groups);         \
  int64_t cutlass_fp8_grouped_workspace_size_##name(int groups);    \
  void cutlass_fp8_grouped_gemm_##name(const CutlassFp8GroupedArgs& args);
DG_CUTLASS_FP8_GROUPED_CONFIG(coop)      // 0
DG_CUTLASS_FP8_GROUPED_CONFIG(coop_2x1)  // 1
DG_CUTLASS_FP8_GROUPED_CONFIG(pingpong)  // 2
DG_CUTLASS_FP8_GROUPED_CONFIG(coop_1x1)  // 3
DG_CUTLASS_FP8_GROUPED_CONFIG(coop_2x2)  // 4
#undef DG_CUTLASS_FP8_GROUPED_CONFIG
}  // namespace dg
