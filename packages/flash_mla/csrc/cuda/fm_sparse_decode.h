// Host interface of fm_sparse_decode.cu (no CUDA or torch headers: the pybind11 side includes it).
#pragma once
#include <stdint.h>

namespace fm {

// Shapes and strides of one launch; see fm_sparse_decode.cu for the layout of every buffer.
struct Params {
  int H;                // heads (any count >= 1; 64 per CTA, a partial last block is masked)
  int topk;             // main-list indices per token (into kv)
  int topk2;            // extra-list indices per token (into kv2; 0 = no extra list)
  int num_splits;       // splits per token (1: out / lse written directly)
  int tiles_per_split;  // 64-row tiles per split
  int has_sink;         // sink != nullptr
  int merge;            // num_splits > 1: 0 partials only (caller merges), 1 / 3 PDL combine (serial / wide), 2 last CTA
  int prefetch_ahead;   // > 0: split 0 of token i prefetches token i + prefetch_ahead's indices and q into L2
  float qk_scale;       // softmax_scale * log2(e)
  int64_t num_tokens;   // query tokens of the launch
  int64_t n_rows, n_rows2;          // cache slots of kv / kv2 (valid index ranges)
  int64_t stride_it, stride_it2;    // index rows (elements)
  int64_t stride_kv, stride_kv2;    // cache rows (bytes)
  int64_t stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh;  // elements
};

struct LaunchArgs {
  // device pointers (data_ptr()); kv2 / idx2 may repeat kv / idx when topk2 = 0; counters: int32 [tokens * head
  // blocks], zero before the launch and left zero after it (merge == 2 only)
  uintptr_t q, kv, idx, kv2, idx2, sink, out, lse, part_o, part_lse, counters;
  int64_t num_tokens;
  Params p;
};

}  // namespace fm

// kv_mode: 0 BF16 cache, 1 FP8 cache (raw staging + dequant_tile), 2 FP8 cache, fp8v path (straight from global
// memory into the bf16 tile; same bits as 1). Returns a cudaError_t code (0 = success).
int fm_launch_sparse_decode(const fm::LaunchArgs& a, int kv_mode, uintptr_t stream);
const char* fm_error_string(int code);
int fm_smem_bytes(bool fp8);
