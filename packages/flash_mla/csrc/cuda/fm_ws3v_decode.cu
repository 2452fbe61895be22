// ws3p's kOptVec build (session 9): fm_ws3_decode.cu compiled again with FM_WS3_VEC_TU, which drops that file's
// exported launchers and adds launch_persist_vec, so the kOptVec kernel instance (opt 24 = ws3p1 + kOptVec, the
// lane-uniform FP8 producer fp8v_tile) lives in this translation unit only (fm_ws3_decode.cu's instances, and
// tests/test_mla_ws.py's count of them, are unchanged). Host interface: fm_ws3p_launch_vec in fm_ws3_decode.h;
// Python: cuda_ws_decode.py variant "ws3p1v" (WS3P_VEC_OPTS).
#define FM_WS3_VEC_TU 1
#include "fm_ws3_decode.cu"

int fm_ws3p_launch_vec(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, int opt, uintptr_t stream) {
  if (!fp8) return (int)cudaErrorInvalidValue;
  return fm_ws3::launch_persist_vec(a, max_ctas, opt, reinterpret_cast<cudaStream_t>(stream));
}
