// Host interface of fm_ws_decode.cu, the warp-specialised sparse MLA kernel (no CUDA or torch headers: the pybind11
// side includes it). Own structs (not fm::Params) so this kernel and fm_sparse_decode.cu can change independently.
#pragma once
#include <stdint.h>

namespace fm_ws {

// Shapes and strides (elements) of one launch; buffer layouts as in fm_sparse_decode.cu.
struct Params {
  int H;                // heads (a multiple of 64)
  int topk;             // indices per token
  int num_splits;       // splits per token (1: out / lse written directly)
  int tiles_per_split;  // 32-row tiles per split (kBN = 32)
  int has_sink;         // sink != nullptr
  float qk_scale;       // softmax_scale * log2(e)
  int64_t n_rows;       // cache slots (valid index range)
  int64_t stride_it, stride_qt, stride_qh, stride_kv, stride_ot, stride_oh, stride_lt, stride_lh;
};

struct LaunchArgs {
  uintptr_t q, kv, idx, sink, out, lse, part_o, part_lse;  // device pointers (data_ptr())
  int64_t num_tokens;
  Params p;
};

}  // namespace fm_ws

// Returns a cudaError_t code (0 = success). variant: 1 = ws (the first kernel), 2 = ws2 (producer signals by
// cp.async.mbarrier.arrive, FP8 scale words loaded with the rows, O rescaled under the next scores); mode: 0 = the
// kernel, 1..6 = timing-only ablations (fm_ws::Mode in fm_ws_decode.cu: producer only, consumers only, no partial-S
// exchange, QK only, PV only, no softmax math).
int fm_ws_launch(const fm_ws::LaunchArgs& a, bool fp8, int variant, int mode, uintptr_t stream);
const char* fm_ws_error_string(int code);
int fm_ws_smem_bytes(bool fp8);
int fm_ws_block_rows();  // KV rows per tile (the unit of tiles_per_split)
