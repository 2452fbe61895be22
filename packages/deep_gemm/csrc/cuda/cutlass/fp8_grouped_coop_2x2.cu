// Grouped FP8 config 4: 128x128x128 cooperative, cluster 2x2 (A multicast across two N tiles, B across two M tiles
// of one expert: a quarter less L2->SM traffic per FLOP than 1x2 / 2x1).
#include "fp8_grouped_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8_grouped::GroupedGemm<cute::Shape<cute::_128, cute::_128, cute::_128>,
                                           cute::Shape<cute::_2, cute::_2, cute::_1>,
                                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                                           cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
}  // namespace
}  // namespace dg

DG_CUTLASS_FP8_GROUPED_ENTRY(coop_2x2, dg::G)
