// Launchers of the register-operand ("rs") W4A8 grouped GEMM (dg_w4a8_rs.cuh), called by dg_w4a8_grouped.cu's
// variant table (schemes 4 / 5 = "rs" with 128 / 256-token tiles, 11-14 = the chunk-pipelined builds); no torch
// headers.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace dg_w4a8 {

struct Params;

// The `pipe` codes of the chunk-pipelined builds (absolute scales, 256-token tiles; rs kernel kPipe 1 / 3 / 5 / 7:
// schemes 11..14): 64-token chunks, chunk c - 1 promoted while chunk c's wgmmas run; kRsPipeFa also loads fa before
// the wait; kRsPipeIlp converts the block's four slices first (interleaved), then issues chunk 0 back to back;
// kRsPipeIlpFa both. (Codes 1, 2, 4 were the folded / cheap / fast-epilogue builds, removed in session 9.)
constexpr int kRsPipe = 8, kRsPipeFa = 9, kRsPipeIlp = 10, kRsPipeIlpFa = 11;

// Dynamic shared memory of the rs kernel with `stages` ring stages, `tok` tokens per tile (128 or 256), `pipe` 0 or a
// kRsPipe* code, and g groups (-1: not compiled).
int w4a8_rs_smem_bytes(int stages, int tok, int pipe, int g);

// Launches the rs kernel (ctas <= 0: one per SM). Returns a cudaError_t code (0: success; -1: not compiled); on
// failure *msg says more.
int w4a8_rs_launch(int stages, int tok, int pipe, const Params& p, int ctas, cudaStream_t stream, std::string* msg);

}  // namespace dg_w4a8
