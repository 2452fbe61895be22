// Launchers of the register-operand ("rs") W4A8 grouped GEMM (dg_w4a8_rs.cuh), called by dg_w4a8_grouped.cu's
// variant table (schemes 4 / 5 = "rs" with 128 / 256-token tiles); no torch headers.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace dg_w4a8 {

struct Params;

// Dynamic shared memory of the rs kernel with `stages` ring stages, `tok` tokens per tile (128 or 256) and g groups
// (-1: not compiled). (The folded / cheap / fast-epilogue builds and the chunk-pipelined n64 builds were removed in
// session 9.)
int w4a8_rs_smem_bytes(int stages, int tok, int g);

// Launches the rs kernel (ctas <= 0: one per SM). Returns a cudaError_t code (0: success; -1: not compiled); on
// failure *msg says more.
int w4a8_rs_launch(int stages, int tok, const Params& p, int ctas, cudaStream_t stream, std::string* msg);

}  // namespace dg_w4a8
