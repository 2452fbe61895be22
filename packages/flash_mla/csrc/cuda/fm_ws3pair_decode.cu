// ws3p's balanced "pair" consumers (session 11, kOptPair, fm_ws3_pair.cuh): fm_ws3_decode.cu compiled again with
// FM_WS3_PAIR_TU, which drops that file's exported launchers and its own option instances, so this translation unit
// holds only ws3p_pair_kernel<false> (BF16 cache, "ws3p2") and <true> (FP8 cache with the lane-uniform producer,
// "ws3p2v"). Host interface: fm_ws3p_launch_pair in fm_ws3_decode.h; Python: cuda_ws_decode.py WS3P_PAIR_OPTS.
#define FM_WS3_PAIR_TU 1
#include "fm_ws3_decode.cu"
#include "fm_ws3_pair.cuh"

int fm_ws3p_launch_pair(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, int opt, uintptr_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  using namespace fm_ws3;
  const int base = fp8 ? kOptPair | kOptVec : kOptPair;
  switch (opt - base) {  // the kernel, or one of its timing-only ablations (wrong results)
    case 0: return fp8 ? launch_pair<true>(a, max_ctas, s) : launch_pair<false>(a, max_ctas, s);
    case kPairProdOnly:
      return fp8 ? launch_pair<true, kPairProdOnly>(a, max_ctas, s) : launch_pair<false, kPairProdOnly>(a, max_ctas, s);
    case kPairConsOnly:
      return fp8 ? launch_pair<true, kPairConsOnly>(a, max_ctas, s) : launch_pair<false, kPairConsOnly>(a, max_ctas, s);
    case kPairRegStage:  // BF16 only: the register-staged producer (FP8's already loads before its release wait)
      return fp8 ? (int)cudaErrorInvalidValue : launch_pair<false, 0, true>(a, max_ctas, s);
    case kPairRegStage | kPairProdOnly:
      return fp8 ? (int)cudaErrorInvalidValue : launch_pair<false, kPairProdOnly, true>(a, max_ctas, s);
    default: return (int)cudaErrorInvalidValue;
  }
}
