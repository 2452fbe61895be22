// pybind11 module deepinfer.flash_mla._C: raw-pointer entry points of the CUDA kernels (no torch headers).
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "fm_sparse_decode.h"
#include "fm_ws_bindings.h"

namespace py = pybind11;

static void sparse_decode(uintptr_t q, uintptr_t kv, uintptr_t idx, uintptr_t kv2, uintptr_t idx2, uintptr_t sink,
                          uintptr_t out, uintptr_t lse, uintptr_t part_o, uintptr_t part_lse, uintptr_t counters,
                          int64_t num_tokens, int H, int topk, int topk2, int num_splits, int tiles_per_split,
                          int merge, int prefetch_ahead, float qk_scale, int64_t n_rows, int64_t n_rows2,
                          int64_t stride_it, int64_t stride_it2, int64_t stride_kv_bytes, int64_t stride_kv2_bytes,
                          int64_t stride_qt, int64_t stride_qh, int64_t stride_ot, int64_t stride_oh,
                          int64_t stride_lt, int64_t stride_lh, int kv_mode, uintptr_t stream) {
  if (kv_mode < 0 || kv_mode > 2)
    throw std::invalid_argument("sparse_decode: kv_mode must be 0 (bf16), 1 (fp8) or 2 (fp8v), got " +
                                std::to_string(kv_mode));
  if (H <= 0) throw std::invalid_argument("sparse_decode: H must be >= 1, got " + std::to_string(H));
  if (topk < 0 || topk2 < 0) throw std::invalid_argument("sparse_decode: topk / topk2 must be >= 0");
  if (num_splits < 1 || tiles_per_split < 0) throw std::invalid_argument("sparse_decode: bad split plan");
  if (merge < 0 || merge > 3) throw std::invalid_argument("sparse_decode: merge must be 0, 1, 2 or 3");
  if (num_splits > 1 && merge == 2 && counters == 0)
    throw std::invalid_argument("sparse_decode: merge = 2 (last CTA) needs a zeroed int32 counter buffer");
  if (topk2 > 0 && (kv2 == 0 || idx2 == 0)) throw std::invalid_argument("sparse_decode: topk2 > 0 needs kv2 / idx2");
  fm::LaunchArgs a{q, kv, idx, kv2 ? kv2 : kv, idx2 ? idx2 : idx, sink, out, lse, part_o, part_lse, counters,
                   num_tokens, {}};
  a.p = fm::Params{H,         topk,       topk2,           num_splits,       tiles_per_split, sink != 0 ? 1 : 0,
                   merge,     prefetch_ahead < 0 ? 0 : prefetch_ahead,        qk_scale,        num_tokens,
                   n_rows,    n_rows2,    stride_it,       stride_it2,       stride_kv_bytes, stride_kv2_bytes,
                   stride_qt, stride_qh,  stride_ot,       stride_oh,        stride_lt,       stride_lh};
  int rc = fm_launch_sparse_decode(a, kv_mode, stream);
  if (rc != 0) throw std::runtime_error(std::string("sparse_decode launch failed: ") + fm_error_string(rc));
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "deepinfer.flash_mla compiled kernels (sm_90a)";
  m.def("sparse_decode", &sparse_decode,
        "Sparse MLA attention, 64 heads x 512 per CTA, wgmma, main + extra index lists (see fm_sparse_decode.cu). "
        "Pointers are data_ptr() ints, index / q / out / lse strides in elements, cache row strides in bytes; "
        "merge: 0 partials only, 1 PDL combine kernel, 2 last CTA, 3 PDL wide combine kernel; prefetch_ahead: token distance of the L2 prefetch "
        "(0: off); kv_mode: 0 BF16 cache, 1 FP8 cache, 2 FP8 cache through the fp8v tile path (same bits as 1; ABI 4); "
        "stream = torch.cuda.current_stream().cuda_stream.");
  fm_register_ws(m);  // the warp-specialised kernels (fm_ws_*), bound in their own file
  m.def("smem_bytes", &fm_smem_bytes, "Dynamic shared memory per CTA (bytes) for the BF16 (False) / FP8 (True) cache");
  m.attr("SPARSE_DECODE_ABI") = 4;  // extra list, byte row strides, merge modes (3: merge = 3), 4: kv_mode 2 (fp8v)
}
