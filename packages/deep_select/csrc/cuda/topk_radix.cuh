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
//   cap:     shared-memory candidate slots per CTA (>= 1); vec: false = scalar loads, true = 16-byte loads (the
//            caller checked that every row base is 16-byte aligned); one_read: keep the candidates while the
//            histogram pass streams the row (one read; two-pass fallback per row on overflow) instead of
//            collecting them in a second pass.
// Returns 0 or a cudaError_t code (launch error).
int topk_radix_launch(std::uintptr_t scores, int dtype, std::int64_t b, std::int64_t n, std::int64_t stride_b,
                      std::uintptr_t lengths, std::uintptr_t starts, std::uintptr_t out, std::int64_t k,
                      std::int64_t stride_ob, std::int64_t stride_ok, int cap, bool vec, bool one_read,
                      std::uintptr_t stream);

// Dynamic shared memory bytes the kernel asks for with `cap` candidate slots.
int topk_radix_smem_bytes(int cap);

}  // namespace deep_select
