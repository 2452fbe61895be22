// Host entry points of the CUTLASS dense FP8 block-scaled GEMM (torch-free: raw device pointers as integers).
//
// D[m, n] (bf16, row-major) = beta * C[m, n] (bf16) + sum_kb sfa[kb, i] * sfb[j/128, kb] * (A[i, kb] . B[j, kb])
//   A   e4m3 [m, k] row-major            B   e4m3 [n, k] row-major (K-major, "nt")
//   sfa fp32 [k/128, sfa_ld] (M-major: the transpose of the API's [m, k/128], rows padded to sfa_ld >= m,
//       sfa_ld % 4 == 0 so each row is 16-byte aligned for TMA; the kernel sees M extent sfa_ld, and columns
//       >= m only scale accumulator rows that are never stored)
//   sfb fp32 [ceil(n/128), k/128] row-major (the API layout as is)
// Requirements (checked in Python, re-checked by CUTLASS can_implement): k % 128 == 0, n % 8 == 0, 16-byte
// aligned base pointers. config: 0 = 128x128x128 cooperative, cluster 1x2, stream-K scheduler;
// 1 = 64x128x128 ping-pong, cluster 1x1, persistent scheduler.
#pragma once

#include <cstdint>

namespace dg {

constexpr int kCutlassFp8Configs = 2;

struct CutlassFp8Args {
  uintptr_t a, sfa, b, sfb, c, d;  // device pointers; c may equal d (beta == 0 means C is never read)
  int m, n, k, sfa_ld;
  float beta;
  uintptr_t workspace;  // device buffer of cutlass_fp8_workspace_size() bytes (may be 0 when that is 0)
  uintptr_t stream;     // cudaStream_t
};

// Bytes of global workspace the kernel needs (stream-K partials); throws std::runtime_error on bad config.
int64_t cutlass_fp8_workspace_size(int config, int m, int n, int k);
// Launches asynchronously on args.stream; throws std::runtime_error when CUTLASS rejects the problem.
void cutlass_fp8_gemm(int config, const CutlassFp8Args& args);

// Per-config entry points (one translation unit each, to keep compile time and memory per TU small).
int64_t cutlass_fp8_workspace_size_coop(int m, int n, int k);
void cutlass_fp8_gemm_coop(const CutlassFp8Args& args);
int64_t cutlass_fp8_workspace_size_pingpong(int m, int n, int k);
void cutlass_fp8_gemm_pingpong(const CutlassFp8Args& args);

}  // namespace dg
