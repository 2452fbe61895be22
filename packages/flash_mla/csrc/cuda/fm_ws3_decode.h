// Host interface of fm_ws3_decode.cu, the ws3 variant of the warp-specialised sparse MLA kernel (no CUDA or torch
// headers: the pybind11 side includes it). Same fm_ws::LaunchArgs as ws / ws2, except that Params::tiles_per_split
// counts 64-row tiles (fm_ws3_block_rows()).
#pragma once
#include <stdint.h>

#include "fm_ws_decode.h"

// Returns a cudaError_t code (0 = success). mode: 0 = the kernel, 1 = producer only, 2 = consumers only (timing-only
// ablations, as fm_ws_launch's modes 1 and 2).
int fm_ws3_launch(const fm_ws::LaunchArgs& a, bool fp8, int mode, uintptr_t stream);
int fm_ws3_smem_bytes(bool fp8);

namespace fm_ws3 {
// The engine's second cache for fm_ws3_launch_extra (same row format as kv): the extra list follows the main list in
// the index space (a.p.topk entries into kv, then topk2 into kv2) and LaunchArgs' tiles_per_split counts 64-row tiles
// of both lists together. n_rows + n_rows2 must fit in int32 (the kernel's combined row ids; checked by the caller).
struct Extra {
  uintptr_t kv2, idx2;  // device pointers: cache rows, int32 [tokens, topk2]
  int topk2;
  int64_t n_rows2;      // slots of kv2 (valid index range)
  int64_t stride_it2;   // index rows (elements)
  int64_t stride_kv2;   // cache rows (bytes; FP8: must be 584, contiguous rows)
};
}  // namespace fm_ws3

// ws3 with the extra cache (mode 0 only: no ablations). Returns a cudaError_t code.
int fm_ws3_launch_extra(const fm_ws::LaunchArgs& a, const fm_ws3::Extra& e, bool fp8, uintptr_t stream);
int fm_ws3_smem_bytes_extra();  // dynamic shared memory per CTA of fm_ws3_launch_extra (16 B more: the skip flags)
int fm_ws3_block_rows();  // KV rows per tile (the unit of tiles_per_split): 64
int fm_ws3_threads(bool fp8);  // threads per CTA: 384 (one producer warpgroup, both caches)

// ws3p: ws3 (mode 0, single cache) in a persistent grid of min(max_ctas or, for max_ctas <= 0, the device's SM count,
// work items) CTAs, each looping over work items (token, split, head block) at a static stride; same arguments,
// results and split-KV format as fm_ws3_launch (session 5 round 5, GPU-run in s6). Returns a cudaError_t code.
int fm_ws3p_launch(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, uintptr_t stream);

// ws3p with option flags (session 6, GPU-run there): opt = fm_ws3_decode.cu's kOpt* bits (1 wide FP8 producer batch,
// 2 lazy O rescale, 4 early scores of the next tile: each keeps ws3p's results bit for bit; 8 one scoring warpgroup,
// not with 1 or 4: same math, last bits differ). Instantiated: BF16 0, 2, 4, 6, 8, 10 (bit 1 ignored), FP8 0, 1, 2, 4,
// 7, 8, 10; another opt returns cudaErrorInvalidValue.
int fm_ws3p_launch_opt(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, int opt, uintptr_t stream);

// ws3p's kOptVec build (session 9, fm_ws3v_decode.cu; NOT GPU-run before its session-9 measuring run): opt 24 =
// ws3p1 (8) + kOptVec (16), the lane-uniform FP8 producer (fp8v_tile), bit-identical to opt 8. FP8 only: fp8 false
// (or another opt) returns cudaErrorInvalidValue (the BF16 cache has no dequant: run opt 8 via fm_ws3p_launch_opt).
// ws3p's adaptive overlap builds (session 10, fm_ws3_decode.cu consumer_p1o; GPU-run in session 10, the API default
// from 128 tokens): FA3-style overlap in the scoring warpgroup (S_{i+1} issued before softmax_i once tile i + 1 has
// landed), bit-identical to their base. BF16: opt 106 = ws3p1l (10) + kOptOverlap (32) + kOptOvlAdapt (64); FP8: 120 =
// ws3p1v (24) + the same. Another (fp8, opt) returns cudaErrorInvalidValue (session 10's blocking 42 / 56 and
// P-mbarrier 234 / 248 builds were removed: slower).
int fm_ws3p_launch_ovl(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, int opt, uintptr_t stream);
int fm_ws3p_launch_vec(const fm_ws::LaunchArgs& a, bool fp8, int max_ctas, int opt, uintptr_t stream);
