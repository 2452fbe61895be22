// Launchers of the warp-specialised W4A8 grouped GEMM (dg_w4a8_ws.cuh), called by dg_w4a8_grouped.cu's variant
// table (scheme 2 = "ws"); no torch headers.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace dg_w4a8 {

struct Params;

// Dynamic shared memory of the ws kernel with `stages` ring stages, pipe (1: pipelined consumers + setmaxnreg) and
// g groups (-1: not compiled).
int w4a8_ws_smem_bytes(int stages, int pipe, int g);

// Launches the ws kernel (ctas <= 0: one per SM). Returns a cudaError_t code (0: success; -1: not compiled); on
// failure *msg says more.
int w4a8_ws_launch(int stages, int pipe, const Params& p, int ctas, cudaStream_t stream, std::string* msg);

}  // namespace dg_w4a8
