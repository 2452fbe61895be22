// Host-side entry points of the FP4-expert CUDA kernels (dg_fp4_grouped.cu); no torch, no CUDA headers needed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dg_fp4 {

// One compiled W4A16 variant: tokens per block (the MMA's N side, 8..64), warps per CTA, 16-row MMA tiles per warp
// (rows per CTA = warps * rt * 16) and cp.async pipeline stages.
struct W4A16Variant {
  int tn, warps, rt, stages;
};

// The compiled variants, in a fixed order.
const std::vector<W4A16Variant>& w4a16_variants();

// Dynamic shared memory bytes a variant asks for.
int w4a16_smem_bytes(int tn, int warps, int rt, int stages);

// out[r] = a[r] @ dequant(packed[i], scales[i])^T for the rows r of group i (offs: int32 [g] cumulative group
// ends, read on the device). a: bf16 [m, k] (16-byte aligned), packed: uint8 [g, n, k/2] (16-byte aligned), scales:
// uint8 E8M0 [g, n, k/32] (4-byte aligned), out: bf16 [m, n]; k % 128 == 0. Rows past offs[g-1] are not written.
// Returns 0 or a cudaError_t code (w4a16_error_string() says more); -1 for an unknown variant.
int w4a16_grouped_launch(int tn, int warps, int rt, int stages, std::uintptr_t a, std::uintptr_t packed,
                         std::uintptr_t scales, std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g,
                         std::uintptr_t stream);

// The message of the last failed launch.
std::string w4a16_error_string();

// ---- kernel 5 (dg_fp4_persistent.cu / .cuh): persistent grid over (active expert, n slab), KT k per stage ----
struct W4A16PVariant {
  int kt, tn, warps, rt, stages;
};

// The compiled persistent variants, in a fixed order.
const std::vector<W4A16PVariant>& w4a16_p_variants();

// Dynamic shared memory bytes a persistent variant asks for with g groups (-1: not compiled).
int w4a16_p_smem_bytes(int kt, int tn, int warps, int rt, int stages, int g);

// Same contract as w4a16_grouped_launch (k % 128 == 0; the k tail of a KT = 512 stage is zero-filled).
int w4a16_p_grouped_launch(int kt, int tn, int warps, int rt, int stages, std::uintptr_t a, std::uintptr_t packed,
                           std::uintptr_t scales, std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g,
                           std::uintptr_t stream);

// The message of the last failed persistent launch.
std::string w4a16_p_error_string();

}  // namespace dg_fp4
