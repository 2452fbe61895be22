// Config 7: 256x128x128 tiles, cooperative (each consumer warpgroup owns 128x128: 128 accumulator + 128 temporary
// fp32 registers per thread, over the 240 setmaxnreg budget, so ptxas spills; opt-in, measured, never auto-selected),
// cluster 1x2 (the 32 KiB A tile multicast to two N tiles), stream-K scheduler, K-major A scales. 48 KiB of A + B per 128-deep k block for 8.4 MFLOP (128x128:
// 32 KiB for 4.2 MFLOP): a third less L2->SM traffic per FLOP. (No 128x256: CUTLASS 4.2's blockwise mainloop builds the
// B-scale register tile as (BLK_M, ScaleNsPerTile) and static_asserts it equals the accumulator shape, so a B tile
// wider than one 128-wide scale block does not compile.)
#include "fp8_gemm_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8::Fp8Gemm<cute::Shape<cute::_256, cute::_128, cute::_128>, cute::Shape<cute::_1, cute::_2, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler,
                               /*SfaMMajor=*/false>;
}  // namespace

int64_t cutlass_fp8_workspace_size_coop_k_256_1x2(const CutlassFp8Args& args) { return cutlass_fp8::workspace_size<G>(args); }
void cutlass_fp8_gemm_coop_k_256_1x2(const CutlassFp8Args& args) { cutlass_fp8::run<G>(args); }

}  // namespace dg
