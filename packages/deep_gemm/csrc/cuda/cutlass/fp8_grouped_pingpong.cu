// Grouped FP8 config 2: 64x128x128 ping-pong, cluster 1x1 (two consumer warpgroups on alternate tiles: one's epilogue hides under the other's MMAs; 64-row tiles waste less on small experts).
#include "fp8_grouped_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8_grouped::GroupedGemm<cute::Shape<cute::_64, cute::_128, cute::_128>,
                                           cute::Shape<cute::_1, cute::_1, cute::_1>,
                                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                                           cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
}  // namespace
}  // namespace dg

DG_CUTLASS_FP8_GROUPED_ENTRY(pingpong, dg::G)
