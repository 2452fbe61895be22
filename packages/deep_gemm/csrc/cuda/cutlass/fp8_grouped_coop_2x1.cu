// Grouped FP8 config 1: 128x128x128 cooperative, cluster 2x1 (B tile multicast across two M tiles of one expert).
#include "fp8_grouped_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8_grouped::GroupedGemm<cute::Shape<cute::_128, cute::_128, cute::_128>,
                                           cute::Shape<cute::_2, cute::_1, cute::_1>,
                                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                                           cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
}  // namespace
}  // namespace dg

DG_CUTLASS_FP8_GROUPED_ENTRY(coop_2x1, dg::G)
