// Config 3: config 2 with cluster 2x1 (B tile multicast along m: the n-heavy K=1024 shapes re-read B less).
#include "fp8_gemm_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8::Fp8Gemm<cute::Shape<cute::_128, cute::_128, cute::_128>, cute::Shape<cute::_2, cute::_1, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler,
                               /*SfaMMajor=*/false>;
}  // namespace

int64_t cutlass_fp8_workspace_size_coop_k_2x1(const CutlassFp8Args& args) { return cutlass_fp8::workspace_size<G>(args); }
void cutlass_fp8_gemm_coop_k_2x1(const CutlassFp8Args& args) { cutlass_fp8::run<G>(args); }

}  // namespace dg
