// pybind11 module deepinfer.flash_mla._C: raw-pointer entry points of the CUDA kernels (no torch headers).
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "fm_sparse_decode.h"
#include "fm_ws_bindings.h"

namespace py = pybind11;

static void sparse_decode(uintptr_t q, uintptr_t kv, uintptr_t idx, uintptr_t sink, uintptr_t out, uintptr_t lse,
                          uintptr_t part_o, uintptr_t part_lse, int64_t num_tokens, int H, int topk, int num_splits,
                          int tiles_per_split, float qk_scale, int64_t n_rows, int64_t stride_it, int64_t stride_qt,
                          int64_t stride_qh, int64_t stride_kv, int64_t stride_ot, int64_t stride_oh,
                          int64_t stride_lt, int64_t stride_lh, bool fp8, uintptr_t stream) {
  if (H <= 0 || H % 64 != 0) throw std::invalid_argument("sparse_decode: H must be a positive multiple of 64");
  if (num_splits < 1 || tiles_per_split < 0) throw std::invalid_argument("sparse_decode: bad split plan");
  fm::LaunchArgs a{q, kv, idx, sink, out, lse, part_o, part_lse, num_tokens, {}};
  a.p = fm::Params{H,         topk,      num_splits, tiles_per_split, sink != 0 ? 1 : 0, qk_scale,  n_rows,
                   stride_it, stride_qt, stride_qh,  stride_kv,       stride_ot,         stride_oh, stride_lt,
                   stride_lh};
  int rc = fm_launch_sparse_decode(a, fp8, stream);
  if (rc != 0) throw std::runtime_error(std::string("sparse_decode launch failed: ") + fm_error_string(rc));
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "deepinfer.flash_mla compiled kernels (sm_90a)";
  m.def("sparse_decode", &sparse_decode,
        "Sparse MLA attention, 64 heads x 512 per CTA, wgmma (see fm_sparse_decode.cu). Pointers are data_ptr() "
        "ints, strides in elements; stream = torch.cuda.current_stream().cuda_stream.");
  fm_register_ws(m);  // the warp-specialised kernels (fm_ws_*), bound in their own file
  m.def("smem_bytes", &fm_smem_bytes, "Dynamic shared memory per CTA (bytes) for the BF16 (False) / FP8 (True) cache");
}
