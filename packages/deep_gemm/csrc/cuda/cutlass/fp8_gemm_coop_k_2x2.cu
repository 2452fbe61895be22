// Config 5: config 2 with cluster 2x2 (A tile multicast across two N tiles and B across two M tiles: a quarter less
// L2->SM traffic per FLOP than 1x2 / 2x1, which matters at 128x128 tiles, where ~1000 TFLOPS needs ~6-8 TB/s of L2).
#include "fp8_gemm_kernel.cuh"

namespace dg {
namespace {
using G = cutlass_fp8::Fp8Gemm<cute::Shape<cute::_128, cute::_128, cute::_128>, cute::Shape<cute::_2, cute::_2, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler,
                               /*SfaMMajor=*/false>;
}  // namespace

int64_t cutlass_fp8_workspace_size_coop_k_2x2(const CutlassFp8Args& args) { return cutlass_fp8::workspace_size<G>(args); }
void cutlass_fp8_gemm_coop_k_2x2(const CutlassFp8Args& args) { cutlass_fp8::run<G>(args); }

}  // namespace dg
