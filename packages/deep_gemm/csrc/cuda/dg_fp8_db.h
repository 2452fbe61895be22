// Launchers of the FP8 block-scaled grouped GEMM with double-buffered promotion (kernels: dg_fp8_db.cuh, dg_fp8_tma.cuh); no torch
// headers. Bound into deepinfer.deep_gemm._C by dg_fp8_db_bindings.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace dg_fp8db {

// (stages, stagger, tma) triples compiled: ring depth; 1 = consumer warpgroup 1 starts ~1 us late; tma 1 = the TMA
// producer (fp8_db_tma_kernel) instead of cp.async, tma 2 = the 128 x 256 tile kernel with the TMA producer
// (fp8_wide_kernel, n % 256 == 0) (dg_fp8_tma.cuh), tma 4 = the W4A8 wide kernel (dg_w4a8_wide.cuh; b = prepared
// FP4 chunks; stages 3 only).
std::vector<std::tuple<int, int, int>> fp8_db_variants();

// Dynamic shared memory of the kernel with `stages` ring stages and g groups; tma 2: fp8_wide_kernel's, tma 4:
// w4a8_wide_kernel's (fixed) (-1: not
// compiled).
int fp8_db_smem_bytes(int stages, int g, int tma = 0);

// out = the grouped GEMM (dg_fp8_db.cuh / dg_fp8_tma.cuh) on raw device pointers; ctas <= 0: one CTA per SM. Returns 0 on success,
// -1 when (stages, stagger, tma) is not compiled, -2 for bad sizes (tma 2, 4: also n % 256 != 0), else a cudaError_t
// code; *msg says more.
int fp8_db_launch(int stages, int stagger, int tma, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t b,
                  std::uintptr_t sfb, std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g, int ctas,
                  std::uintptr_t stream, std::string* msg);

}  // namespace dg_fp8db
