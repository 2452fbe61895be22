// Config 4: config 1 with K-major A scales (no per-call transpose: matters at small m, where it is ~10 % of the call).
#include "fp8_gemm_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8::Fp8Gemm<cute::Shape<cute::_64, cute::_128, cute::_128>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecialized, cutlass::gemm::PersistentScheduler,
                               /*SfaMMajor=*/false>;
}  // namespace

int64_t cutlass_fp8_workspace_size_pingpong_k(const CutlassFp8Args& args) { return cutlass_fp8::workspace_size<G>(args); }
void cutlass_fp8_gemm_pingpong_k(const CutlassFp8Args& args) { cutlass_fp8::run<G>(args); }

}  // namespace dg
