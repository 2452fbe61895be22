// DIAGNOSTIC builds of the rs kernel (dg_w4a8_rs.cuh, kAblate): the 256-token, 4-stage kernel (cuda_rs2s4n256) with
// one part of the consumers' work removed, to be TIMED only (their outputs are wrong). Not a user variant: bound as
// `w4a8_rs_ablate` (dg_w4a8_bindings.cpp), called by benchmarks/bench_dg_w4a8_ablate.py through
// backends/cuda/cuda_w4a8_rs_ablate.py. No torch headers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dg_w4a8 {

// The compiled ablation masks (kAblNoConv = 1, kAblNoPromo = 2, kAblNoMma = 4, kAblProdOnly = 8, 3 = 1 | 2,
// kAblNoStore = 16, kAblNoFfma = 32).
std::vector<int> w4a8_rs_ablate_masks();

// Launches cuda_rs2s4n256 with ablation `mask` on the same operands as w4a8_grouped_launch (ctas <= 0: one per SM).
// Returns 0 on success, -1 for a mask not compiled, -2 for bad sizes, else a cudaError_t code; *msg says more.
int w4a8_rs_ablate_launch(int mask, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t packed, std::uintptr_t scales,
                          std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g, int ctas,
                          std::uintptr_t stream, std::string* msg);

}  // namespace dg_w4a8
