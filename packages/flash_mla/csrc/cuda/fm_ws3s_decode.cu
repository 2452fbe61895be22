// ws3p's kOptDq builds (session 8): fm_ws3_decode.cu compiled again with FM_WS3_DQ_TU, which drops that file's exported
// launchers and adds launch_persist_dq, so the kOptDq kernel instances (ws3p1 whose consumer warpgroup 1 dequantises
// the last 8 / 16 / 24 rows of each FP8 tile: opt 72 / 136 / 264; 648 / 776: 16 / 24 rows staged raw by cp.async a
// tile ahead) live in this translation unit only. Host interface: fm_ws3p_launch_dq in fm_ws3_decode.h; Python:
// cuda_ws_decode.py variants "ws3p1s8" / "ws3p1s16" / "ws3p1s24" / "ws3p1s16e" / "ws3p1s24e" (WS3P_DQ_OPTS).
#define FM_WS3_DQ_TU 1
#define FM_WS3_WATCHDOG 1  // new mbarrier protocol: a stuck wait traps (fm_ws3_decode.cu mbar_wait)
#include "fm_ws3_decode.cu"

int fm_ws3p_launch_dq(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, int opt, uintptr_t stream) {
  if (!fp8) return (int)cudaErrorInvalidValue;
  return fm_ws3::launch_persist_dq(a, max_ctas, opt, reinterpret_cast<cudaStream_t>(stream));
}
