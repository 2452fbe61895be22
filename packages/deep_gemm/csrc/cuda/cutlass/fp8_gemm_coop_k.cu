// Config 2: config 0 with K-major A scales (the API's [m, k/128] as is: no per-call transpose).
#include "fp8_gemm_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8::Fp8Gemm<cute::Shape<cute::_128, cute::_128, cute::_128>, cute::Shape<cute::_1, cute::_2, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler,
                               /*SfaMMajor=*/false>;
}  // namespace

int64_t cutlass_fp8_workspace_size_coop_k(const CutlassFp8Args& args) { return cutlass_fp8::workspace_size<G>(args); }
void cutlass_fp8_gemm_coop_k(const CutlassFp8Args& args) { cutlass_fp8::run<G>(args); }

}  // namespace dg
