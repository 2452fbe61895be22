// Host-side entry points of the W4A8 FP8-wgmma grouped GEMM (dg_w4a8_grouped.cu); no torch, no CUDA headers needed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dg_w4a8 {

// One compiled variant: consumer warpgroups (token rows per tile = 64 * wg; 128 weight rows), ring stages, and rel
// (the scheme: 0 absolute, 1 row-reference scales: a pre-pass writes per weight row its largest scale byte, see
// dg_w4a8_grouped.cuh; 2 "ws": the warp-specialised kernel of dg_w4a8_ws.cuh, absolute numerics, wg = 2;
// 3 "wsp": ws with pipelined consumers; 4 "rs": the weights as the wgmma's register operand, dg_w4a8_rs.cuh, wg = 2, 128-token
// tiles; 5: rs with 256-token tiles).
struct W4A8Variant {
  int wg, stages;
  int rel;
};

// The compiled variants, in a fixed order.
const std::vector<W4A8Variant>& w4a8_variants();

// Dynamic shared memory bytes a variant asks for with g groups (-1: not compiled).
int w4a8_smem_bytes(int wg, int stages, int rel, int g);

// out[r] = (a[r] * sfa[r]) @ dequant(packed[i], scales[i])^T for the rows r of group i (offs: int32 [g] cumulative
// group ends, read on the device). a: e4m3 [m, k] (16-byte aligned), sfa: fp32 [m, k/128], packed: uint8 [g, n, k/2]
// (16-byte aligned), scales: uint8 E8M0 [g, n, k/32] (4-byte aligned), out: bf16 [m, n]; k % 128 == 0, n % 16 == 0,
// 1 <= g <= 4096. sref: rel variants' workspace, uint16 [g, n], 16-byte aligned (written by the launch; 0 otherwise).
// Rows past offs[g-1] are not written. ctas: persistent CTAs (0: one wave at full occupancy).
// Returns 0 or a cudaError_t code (w4a8_error_string() says more); -1 for an unknown variant, -2 for bad sizes.
int w4a8_grouped_launch(int wg, int stages, int rel, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t packed,
                        std::uintptr_t scales, std::uintptr_t offs, std::uintptr_t out, std::uintptr_t sref, int m,
                        int n, int k, int g, int ctas, std::uintptr_t stream);

// The message of the last failed launch.
std::string w4a8_error_string();

}  // namespace dg_w4a8
