// Grouped FP8 config 5: 256x128x128 cooperative, cluster 1x1. Each consumer warpgroup holds 128x128 (128 accumulator
// + 128 temporary fp32 registers per thread: ptxas spills; opt-in, measured, never auto-selected). 48 KiB of A + B per
// k block for 8.4 MFLOP instead of 32 KiB for 4.2 (128x128). Experts with <= 128 rows waste half the tile.
#include "fp8_grouped_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8_grouped::GroupedGemm<cute::Shape<cute::_256, cute::_128, cute::_128>,
                                           cute::Shape<cute::_1, cute::_1, cute::_1>,
                                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                                           cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
}  // namespace
}  // namespace dg

DG_CUTLASS_FP8_GROUPED_ENTRY(coop_256, dg::G)
