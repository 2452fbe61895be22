// Config 1: 64x128x128 tiles, two consumer warpgroups alternating tiles (ping-pong: one's epilogue overlaps the
// other's MMA), cluster 1x1, persistent scheduler (ping-pong does not support stream-K). For small m. M-major A scales.
#include "fp8_gemm_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8::Fp8Gemm<cute::Shape<cute::_64, cute::_128, cute::_128>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecialized, cutlass::gemm::PersistentScheduler,
                               /*SfaMMajor=*/true>;
}  // namespace

int64_t cutlass_fp8_workspace_size_pingpong(const CutlassFp8Args& args) { return cutlass_fp8::workspace_size<G>(args); }
void cutlass_fp8_gemm_pingpong(const CutlassFp8Args& args) { cutlass_fp8::run<G>(args); }

}  // namespace dg
