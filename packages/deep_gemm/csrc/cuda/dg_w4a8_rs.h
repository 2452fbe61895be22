// Launchers of the register-operand ("rs") W4A8 grouped GEMM (dg_w4a8_rs.cuh), called by dg_w4a8_grouped.cu's
// variant table (scheme 4 = "rs"); no torch headers.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace dg_w4a8 {

struct Params;

constexpr int kRsEpi = 4;  // the `fold` code of the fast-epilogue builds (absolute scales)

// Dynamic shared memory of the rs kernel with `stages` ring stages, `tok` tokens per tile (128 or 256), row-reference
// folding (`fold` 1: schemes 6 / 7; 2: + the cheaper conversion, scheme 8; p.sref a [g, n] uint16 workspace) and g
// groups (-1: not compiled). fold == kRsEpi: no folding, the fast epilogue (staged in shared memory, coalesced
// 16-byte stores; schemes 9 / 10).
int w4a8_rs_smem_bytes(int stages, int tok, int fold, int g);

// Launches the rs kernel (ctas <= 0: one per SM). Returns a cudaError_t code (0: success; -1: not compiled); on
// failure *msg says more.
int w4a8_rs_launch(int stages, int tok, int fold, const Params& p, int ctas, cudaStream_t stream, std::string* msg);

}  // namespace dg_w4a8
