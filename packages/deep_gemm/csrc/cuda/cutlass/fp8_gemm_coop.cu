// Config 0: 128x128x128 tiles, two consumer warpgroups (cooperative), cluster 1x2 (A tile multicast along n),
// stream-K scheduler (splits k when there are fewer tiles than SMs: the small-m / decode shapes); M-major A scales.
#include "fp8_gemm_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8::Fp8Gemm<cute::Shape<cute::_128, cute::_128, cute::_128>, cute::Shape<cute::_1, cute::_2, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler,
                               /*SfaMMajor=*/true>;
}  // namespace

int64_t cutlass_fp8_workspace_size_coop(const CutlassFp8Args& args) { return cutlass_fp8::workspace_size<G>(args); }
void cutlass_fp8_gemm_coop(const CutlassFp8Args& args) { cutlass_fp8::run<G>(args); }

}  // namespace dg
