// Grouped FP8 config 0: 128x128x128 cooperative, cluster 1x2 (A tile multicast across the two N tiles; the session-3 kernel).
#include "fp8_grouped_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8_grouped::GroupedGemm<cute::Shape<cute::_128, cute::_128, cute::_128>,
                                           cute::Shape<cute::_1, cute::_2, cute::_1>,
                                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                                           cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
}  // namespace
}  // namespace dg

DG_CUTLASS_FP8_GROUPED_ENTRY(coop, dg::G)
