// Host entry points of the W4A16 "dequantise, then CUTLASS bf16 grouped GEMM" path (w4a16_dq_kernel.cuh; one
// w4a16_dq_<name>.cu per config). torch-free: raw device pointers as integers.
//
// out[r, :] = a[r, :] @ W_e^T for the rows r of expert e (offs: int32 [g] cumulative END rows, torch._grouped_mm
// convention; clamped to [0, m] on the device, never read on the host), W_e = e2m1(packed[e]) * 2^(scales[e] - 127):
//   a bf16 [m, k] row-major; packed uint8 [g, n, k/2] (LOW nibble = element 2j); scales uint8 E8M0 [g, n, k/32];
//   d bf16 [m, n] row-major (rows past offs[g-1] untouched); k % 128 == 0, n % 16 == 0, 16-byte aligned pointers.
// Experts are processed in chunks of `chunk`: per chunk, one kernel dequantises the chunk's NON-EMPTY experts into
// `scratch` (bf16 [chunk, n, k]; exact: every e2m1 * E8M0 product with scale byte <= 252 is a bf16, subnormals
// included; byte 255 gives NaN like the reference), one kernel builds the chunk's problems (rows from offs) and
// pointers in `aux`, then CUTLASS's SM90 ptr-array grouped GEMM (TMA + wgmma, fp32 accumulation) runs on them. All on
// `stream`, no host sync (CUDA-graph safe); chunks reuse scratch / aux / workspace in stream order.
// Configs (index: tile, schedule, cluster): 0: 128x256x64 cooperative, 1x1   1: 64x256x64 ping-pong, 1x1
// Scheduler knobs (runtime): raster 0/1 along M, 2 along N; swizzle 1, 2, 4 or 8.
#pragma once

#include <cstdint>

namespace dg {
constexpr int kCutlassW4A16DqConfigs = 2;

struct CutlassW4A16DqArgs {
  uintptr_t a, packed, scales, offs, d;  // device pointers (layouts above)
  int m, n, k, groups;
  int chunk;            // experts per chunk, 1..groups: scratch holds chunk * n * k bf16
  uintptr_t scratch;    // bf16 [chunk, n, k]
  uintptr_t aux;        // cutlass_w4a16_dq_aux_bytes(config, chunk) bytes
  uintptr_t workspace;  // cutlass_w4a16_dq_workspace_size(config, chunk) bytes
  uintptr_t stream;     // cudaStream_t
  int config = 0, raster = 0, swizzle = 1;
};
int64_t cutlass_w4a16_dq_aux_bytes(int config, int chunk);
int64_t cutlass_w4a16_dq_workspace_size(int config, int chunk);
void cutlass_w4a16_dq_gemm(const CutlassW4A16DqArgs& args);

#define DG_CUTLASS_W4A16_DQ_CONFIG(name)                          \
  int64_t cutlass_w4a16_dq_aux_bytes_##name(int chunk);            \
  int64_t cutlass_w4a16_dq_workspace_size_##name(int chunk);       \
  void cutlass_w4a16_dq_gemm_##name(const CutlassW4A16DqArgs& args);
DG_CUTLASS_W4A16_DQ_CONFIG(coop)      // 0
DG_CUTLASS_W4A16_DQ_CONFIG(pingpong)  // 1
#undef DG_CUTLASS_W4A16_DQ_CONFIG
}  // namespace dg
