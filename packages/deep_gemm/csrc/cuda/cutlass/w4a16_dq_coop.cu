// W4A16 dequantise-then-grouped-bf16 config 0: 128x256x64 cooperative (two consumer warpgroups of 64x256), 1x1.
#include "w4a16_dq_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_w4a16_dq::GroupedGemm<cute::Shape<cute::_128, cute::_256, cute::_64>,
                                        cute::Shape<cute::_1, cute::_1, cute::_1>,
                                        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                        cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
}  // namespace
}  // namespace dg

DG_CUTLASS_W4A16_DQ_ENTRY(coop, dg::G)
