// Host interface of fm_sparse_decode.cu (no CUDA or torch headers: the pybind11 side includes it).
#pragma once
#include <stdint.h>

namespace fm {

// Shapes and strides (elements) of one launch; see fm_sparse_decode.cu for the layout of every buffer.
struct Params {
  int H;                // heads (a multiple of 64)
  int topk;             // indices per token
  int num_splits;       // splits per token (1: out / lse written directly)
  int tiles_per_split;  // 64-row tiles per split
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

}  // namespace fm

// Returns a cudaError_t code (0 = success).
int fm_launch_sparse_decode(const fm::LaunchArgs& a, bool fp8, uintptr_t stream);
const char* fm_error_string(int code);
int fm_smem_bytes(bool fp8);
