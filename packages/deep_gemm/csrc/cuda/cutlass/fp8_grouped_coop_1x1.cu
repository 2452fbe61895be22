// Grouped FP8 config 3: 128x128x128 cooperative, cluster 1x1 (no multicast: every CTA schedules alone, no cluster-pair tail).
#include "fp8_grouped_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8_grouped::GroupedGemm<cute::Shape<cute::_128, cute::_128, cute::_128>,
                                           cute::Shape<cute::_1, cute::_1, cute::_1>,
                                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                                           cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
}  // namespace
}  // namespace dg

DG_CUTLASS_FP8_GROUPED_ENTRY(coop_1x1, dg::G)
