// deep_select CUDA radix top-k: host-side launcher declaration (no torch, no CUDA headers needed by callers).
#pragma once

#include <cstdint>

namespace deep_select {

// Element type codes shared with the Python side (backends/cuda/cuda_topk.py).
enum DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Row-wise exact top-k ids (unsorted, -1 padded), the `deep_select.topk` contract.
//   scores:  device pointer to [b, n] raw score bits, unit column stride, row stride `stride_b` elements.
//   lengths: device int32 [b] or 0 (row r uses columns [lo, clamp(lengths[r], lo, n))).
//   starts:  device int32 [b] or 0 (ragged form: lo = clamp(starts[r], 0, n); ids relative to starts[r]).
//   out:     device int32 [b, k], row stride `stride_ob`, column stride `stride_ok` (elements).
//   cap:     shared-memory candidate slots per CTA (1 .. 8192); vec: false = scalar loads, true = 16-byte loads
//            (the caller checked that every row base is 16-byte aligned); mode: kModeTwoPass (0: histogram pass,
//            then a collecting pass), kModeOneRead (1: round 1's one-read pass), kModeFast (2: the filtered,
//            prefetching one-read pass), kModeLean (3: the fast pass with a 1-2 instruction filter per entry),
//            kModeLeanPf (4: lean + bulk L2 prefetch 3 tiles ahead; 16-byte loads, else plain lean);
//            the one-read modes fall back per row to two passes on overflow.
//   segs, gather, gather_m: the split for few long rows (segs = 1, gather = 0 otherwise). segs > 1 (no starts):
//            grid b x segs, CTA x writes the top k of segment x % segs of row x / segs, as row ids, to out row x
//            (out is [b * segs, k]). gather != 0: the merge, grid b; row r selects among the gather_m ids of
//            int32 row r of gather (row stride gather_m, -1 = none) by the values they name in row r of scores,
//            min(k, length) of them (lengths as usual; n = the row width of scores).
// Returns 0 or a cudaError_t code; topk_radix_error_string() then describes the failure (step, variant, smem,
// grid).
int topk_radix_launch(std::uintptr_t scores, int dtype, std::int64_t b, std::int64_t n, std::int64_t stride_b,
                      std::uintptr_t lengths, std::uintptr_t starts, std::uintptr_t out, std::int64_t k,
                      std::int64_t stride_ob, std::int64_t stride_ok, int cap, bool vec, int mode, int segs,
                      std::uintptr_t gather, std::int64_t gather_m, std::uintptr_t stream);

// The message of the last failed topk_radix_launch (empty before any failure).
const char* topk_radix_error_string();

// Dynamic shared memory bytes the kernel asks for with `cap` candidate slots.
int topk_radix_smem_bytes(int cap);

}  // namespace deep_select
