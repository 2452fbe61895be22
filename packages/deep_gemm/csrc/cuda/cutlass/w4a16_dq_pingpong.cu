// W4A16 dequantise-then-grouped-bf16 config 1: 64x256x64 ping-pong, 1x1 (64-row tiles: no half-empty M tile at
// 64 rows per expert).
#include "w4a16_dq_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_w4a16_dq::GroupedGemm<cute::Shape<cute::_64, cute::_256, cute::_64>,
                                        cute::Shape<cute::_1, cute::_1, cute::_1>,
                                        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                                        cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
}  // namespace
}  // namespace dg

DG_CUTLASS_W4A16_DQ_ENTRY(pingpong, dg::G)
