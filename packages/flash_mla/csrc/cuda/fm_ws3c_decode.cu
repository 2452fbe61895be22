// ws3p's kOptCvt builds (session 7): fm_ws3_decode.cu compiled again with FM_WS3_CVT_TU, which drops that file's
// exported launchers and adds launch_persist_cvt, so the kOptCvt kernel instances live in this translation unit only
// (fm_ws3_decode.cu's instances, and tests/test_mla_ws.py's count of them, are unchanged). Host interface:
// fm_ws3p_launch_cvt in fm_ws3_decode.h; Python: cuda_ws_decode.py variants "ws3p1c" / "ws3p1h"
// (WS3P_CVT_OPTS).
#define FM_WS3_CVT_TU 1
#include "fm_ws3_decode.cu"

int fm_ws3p_launch_cvt(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, int opt, uintptr_t stream) {
  if (!fp8) return (int)cudaErrorInvalidValue;
  return fm_ws3::launch_persist_cvt(a, max_ctas, opt, reinterpret_cast<cudaStream_t>(stream));
}
