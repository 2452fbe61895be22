// Entry points of the warp-specialised sparse attention kernel (fm_ws_decode.cu), added to deepinfer.flash_mla._C by
// fm_register_ws (called from fm_bindings.cpp). Raw data_ptr ints + sizes + stream; no torch headers.
#include "fm_ws_bindings.h"

#include <stdexcept>
#include <string>

#include "fm_ws3_decode.h"
#include "fm_ws_decode.h"

static void sparse_decode_ws(uintptr_t q, uintptr_t kv, uintptr_t idx, uintptr_t sink, uintptr_t out, uintptr_t lse,
                             uintptr_t part_o, uintptr_t part_lse, int64_t num_tokens, int H, int topk,
                             int num_splits, int tiles_per_split, float qk_scale, int64_t n_rows, int64_t stride_it,
                             int64_t stride_qt, int64_t stride_qh, int64_t stride_kv, int64_t stride_ot,
                             int64_t stride_oh, int64_t stride_lt, int64_t stride_lh, bool fp8, int variant, int mode,
                             uintptr_t stream) {
  if (H <= 0 || H % 64 != 0) throw std::invalid_argument("sparse_decode_ws: H must be a positive multiple of 64");
  if (variant < 1 || variant > 3)
    throw std::invalid_argument("sparse_decode_ws: variant must be 1 (ws), 2 (ws2) or 3 (ws3)");
  if (mode < 0 || mode > (variant == 3 ? 2 : 6))
    throw std::invalid_argument("sparse_decode_ws: mode must be 0 (kernel) .. 6 (ablations; ws3: .. 2)");
  if (num_splits < 1 || tiles_per_split < 0) throw std::invalid_argument("sparse_decode_ws: bad split plan");
  if (num_splits > 1 && (part_o == 0 || part_lse == 0))
    throw std::invalid_argument("sparse_decode_ws: num_splits > 1 needs the part_o / part_lse workspaces");
  fm_ws::LaunchArgs a{q, kv, idx, sink, out, lse, part_o, part_lse, num_tokens, {}};
  a.p = fm_ws::Params{H,         topk,      num_splits, tiles_per_split, sink != 0 ? 1 : 0, qk_scale,  n_rows,
                      stride_it, stride_qt, stride_qh,  stride_kv,       stride_ot,         stride_oh, stride_lt,
                      stride_lh};
  const int rc = variant == 3 ? fm_ws3_launch(a, fp8, mode, stream) : fm_ws_launch(a, fp8, variant, mode, stream);
  if (rc != 0) throw std::runtime_error(std::string("sparse_decode_ws launch failed: ") + fm_ws_error_string(rc));
}

// ws3 with the engine's second cache (fm_ws3_launch_extra): the main list (topk into kv) followed by the extra list
// (topk2 into kv2, same row format), tiles_per_split in 64-row tiles of both lists. Strides of kv2 in bytes.
static void sparse_decode_ws3_extra(uintptr_t q, uintptr_t kv, uintptr_t idx, uintptr_t kv2, uintptr_t idx2,
                                    uintptr_t sink, uintptr_t out, uintptr_t lse, uintptr_t part_o,
                                    uintptr_t part_lse, int64_t num_tokens, int H, int topk, int topk2,
                                    int num_splits, int tiles_per_split, float qk_scale, int64_t n_rows,
                                    int64_t n_rows2, int64_t stride_it, int64_t stride_it2, int64_t stride_qt,
                                    int64_t stride_qh, int64_t stride_kv, int64_t stride_kv2_bytes,
                                    int64_t stride_ot, int64_t stride_oh, int64_t stride_lt, int64_t stride_lh,
                                    bool fp8, uintptr_t stream) {
  if (H <= 0 || H % 64 != 0)
    throw std::invalid_argument("sparse_decode_ws3_extra: H must be a positive multiple of 64");
  if (num_splits < 1 || tiles_per_split < 0 || topk < 0 || topk2 < 0)
    throw std::invalid_argument("sparse_decode_ws3_extra: bad split plan or index widths");
  if (num_splits > 1 && (part_o == 0 || part_lse == 0))
    throw std::invalid_argument("sparse_decode_ws3_extra: num_splits > 1 needs the part_o / part_lse workspaces");
  if (n_rows < 0 || n_rows2 < 0 || n_rows + n_rows2 > 2147483647LL)
    throw std::invalid_argument("sparse_decode_ws3_extra: n_rows + n_rows2 must fit in int32 (combined row ids)");
  if (fp8 && stride_kv2_bytes != 584)
    throw std::invalid_argument("sparse_decode_ws3_extra: FP8 extra rows must be contiguous 584-byte rows");
  fm_ws::LaunchArgs a{q, kv, idx, sink, out, lse, part_o, part_lse, num_tokens, {}};
  a.p = fm_ws::Params{H,         topk,      num_splits, tiles_per_split, sink != 0 ? 1 : 0, qk_scale,  n_rows,
                      stride_it, stride_qt, stride_qh,  stride_kv,       stride_ot,         stride_oh, stride_lt,
                      stride_lh};
  const fm_ws3::Extra e{kv2, idx2, topk2, n_rows2, stride_it2, stride_kv2_bytes};
  const int rc = fm_ws3_launch_extra(a, e, fp8, stream);
  if (rc != 0)
    throw std::runtime_error(std::string("sparse_decode_ws3_extra launch failed: ") + fm_ws_error_string(rc));
}

// ws3p (fm_ws3p_launch): ws3 in a persistent grid; sparse_decode_ws's arguments for variant 3 mode 0, with max_ctas
// (0: one CTA per SM; > 0: a cap on the grid, tests use it to give every CTA several work items) in place of
// variant / mode.
static void sparse_decode_ws3p(uintptr_t q, uintptr_t kv, uintptr_t idx, uintptr_t sink, uintptr_t out, uintptr_t lse,
                               uintptr_t part_o, uintptr_t part_lse, int64_t num_tokens, int H, int topk,
                               int num_splits, int tiles_per_split, float qk_scale, int64_t n_rows, int64_t stride_it,
                               int64_t stride_qt, int64_t stride_qh, int64_t stride_kv, int64_t stride_ot,
                               int64_t stride_oh, int64_t stride_lt, int64_t stride_lh, bool fp8, int max_ctas,
                               uintptr_t stream) {
  if (H <= 0 || H % 64 != 0) throw std::invalid_argument("sparse_decode_ws3p: H must be a positive multiple of 64");
  if (num_splits < 1 || tiles_per_split < 0) throw std::invalid_argument("sparse_decode_ws3p: bad split plan");
  if (max_ctas < 0) throw std::invalid_argument("sparse_decode_ws3p: max_ctas must be >= 0 (0: one CTA per SM)");
  if (num_splits > 1 && (part_o == 0 || part_lse == 0))
    throw std::invalid_argument("sparse_decode_ws3p: num_splits > 1 needs the part_o / part_lse workspaces");
  fm_ws::LaunchArgs a{q, kv, idx, sink, out, lse, part_o, part_lse, num_tokens, {}};
  a.p = fm_ws::Params{H,         topk,      num_splits, tiles_per_split, sink != 0 ? 1 : 0, qk_scale,  n_rows,
                      stride_it, stride_qt, stride_qh,  stride_kv,       stride_ot,         stride_oh, stride_lt,
                      stride_lh};
  const int rc = fm_ws3p_launch(a, fp8, max_ctas, stream);
  if (rc != 0) throw std::runtime_error(std::string("sparse_decode_ws3p launch failed: ") + fm_ws_error_string(rc));
}

using Ws3pLaunch = int (*)(const fm_ws::LaunchArgs&, bool, int, int, uintptr_t);

// The shared body of the ws3p option-build bindings below (one argument list, checks, Params, launch and error text):
// `bad_opt` is the caller's message for an opt its launcher does not build ("" when opt is fine).
static void ws3p_run(const std::string& name, Ws3pLaunch launch, const std::string& bad_opt, uintptr_t q, uintptr_t kv,
                     uintptr_t idx, uintptr_t sink, uintptr_t out, uintptr_t lse, uintptr_t part_o, uintptr_t part_lse,
                     int64_t num_tokens, int H, int topk, int num_splits, int tiles_per_split, float qk_scale,
                     int64_t n_rows, int64_t stride_it, int64_t stride_qt, int64_t stride_qh, int64_t stride_kv,
                     int64_t stride_ot, int64_t stride_oh, int64_t stride_lt, int64_t stride_lh, bool fp8, int max_ctas,
                     int opt, uintptr_t stream) {
  if (H <= 0 || H % 64 != 0) throw std::invalid_argument(name + ": H must be a positive multiple of 64");
  if (num_splits < 1 || tiles_per_split < 0) throw std::invalid_argument(name + ": bad split plan");
  if (max_ctas < 0) throw std::invalid_argument(name + ": max_ctas must be >= 0 (0: one CTA per SM)");
  if (!bad_opt.empty()) throw std::invalid_argument(name + ": " + bad_opt);
  if (num_splits > 1 && (part_o == 0 || part_lse == 0))
    throw std::invalid_argument(name + ": num_splits > 1 needs the part_o / part_lse workspaces");
  fm_ws::LaunchArgs a{q, kv, idx, sink, out, lse, part_o, part_lse, num_tokens, {}};
  a.p = fm_ws::Params{H,         topk,      num_splits, tiles_per_split, sink != 0 ? 1 : 0, qk_scale,  n_rows,
                      stride_it, stride_qt, stride_qh,  stride_kv,       stride_ot,         stride_oh, stride_lt,
                      stride_lh};
  const int rc = launch(a, fp8, max_ctas, opt, stream);
  if (rc != 0)
    throw std::runtime_error(name + " launch failed (opt " + std::to_string(opt) + "): " + fm_ws_error_string(rc));
}

// The bindings' common argument list (sparse_decode_ws3p's plus fp8, max_ctas, opt) and its forwarding.
#define WS3P_ARGS                                                                                                   \
  uintptr_t q, uintptr_t kv, uintptr_t idx, uintptr_t sink, uintptr_t out, uintptr_t lse, uintptr_t part_o,          \
      uintptr_t part_lse, int64_t num_tokens, int H, int topk, int num_splits, int tiles_per_split, float qk_scale, \
      int64_t n_rows, int64_t stride_it, int64_t stride_qt, int64_t stride_qh, int64_t stride_kv, int64_t stride_ot, \
      int64_t stride_oh, int64_t stride_lt, int64_t stride_lh, bool fp8, int max_ctas, int opt, uintptr_t stream
#define WS3P_FORWARD                                                                                               \
  q, kv, idx, sink, out, lse, part_o, part_lse, num_tokens, H, topk, num_splits, tiles_per_split, qk_scale, n_rows, \
      stride_it, stride_qt, stride_qh, stride_kv, stride_ot, stride_oh, stride_lt, stride_lh, fp8, max_ctas, opt, stream

// ws3p with option flags (fm_ws3p_launch_opt, session 6): sparse_decode_ws3p's arguments plus opt (fm_ws3_decode.cu's
// kOpt* bits: 1 wide FP8 producer batch, 2 lazy O rescale, 4 early scores of the next tile, 8 one scoring warpgroup)
// before stream.
static void sparse_decode_ws3p_opt(WS3P_ARGS) {
  const std::string bad = opt < 0 || opt > 15 ? "opt must be 0..15 (kOpt* bits)" : "";
  ws3p_run("sparse_decode_ws3p_opt", fm_ws3p_launch_opt, bad, WS3P_FORWARD);
}

// ws3p's kOptVec build (fm_ws3p_launch_vec, session 9, fm_ws3v_decode.cu): sparse_decode_ws3p_opt's arguments; FP8
// cache only, opt 24 (ws3p1 + the lane-uniform FP8 producer).
static void sparse_decode_ws3p_vec(WS3P_ARGS) {
  std::string bad = fp8 ? "" : "FP8 cache only (fp8 must be true)";
  if (bad.empty() && opt != 24) bad = "opt must be 24, got " + std::to_string(opt);
  ws3p_run("sparse_decode_ws3p_vec", fm_ws3p_launch_vec, bad, WS3P_FORWARD);
}

// ws3p's adaptive overlap builds (fm_ws3p_launch_ovl, session 10, fm_ws3_decode.cu consumer_p1o):
// sparse_decode_ws3p_opt's arguments; opt BF16 106 (ws3p1l + adaptive overlap), FP8 120 (ws3p1v + the same).
static void sparse_decode_ws3p_ovl(WS3P_ARGS) {
  // (632: + kOptVecWide, session 11; 1130 / 1658: + kOptThresh (FP8: and kOptLazy), session 14)
  const bool ok = fp8 ? (opt == 120 || opt == 632 || opt == 1658) : (opt == 106 || opt == 1130);
  const std::string bad = ok ? ""
                              : "opt must be 106 / 1130 (BF16) or 120 / 632 / 1658 (FP8), got " + std::to_string(opt) +
                                    (fp8 ? " with fp8" : " with bf16");
  ws3p_run("sparse_decode_ws3p_ovl", fm_ws3p_launch_ovl, bad, WS3P_FORWARD);
}
#undef WS3P_ARGS
#undef WS3P_FORWARD

void fm_register_ws(pybind11::module_& m) {
  m.def("sparse_decode_ws", &sparse_decode_ws,
        "Warp-specialised sparse MLA attention (fm_ws_decode.cu): 64 heads x 512 per CTA, a producer warpgroup "
        "gathering 32-row tiles, two wgmma consumer warpgroups. Same arguments as sparse_decode except "
        "tiles_per_split, counted in ws_block_rows()-row tiles (ws3: ws3_block_rows()), and variant (1 = ws, 2 = ws2, "
        "3 = ws3: fm_ws3_decode.cu, 64-row tiles) / mode (0 = the kernel, 1..6 = timing-only ablations: producer only, "
        "consumers only, no S exchange, QK only, PV only, no softmax math; ws3: 0..2) before stream.");
  m.def("ws_smem_bytes", &fm_ws_smem_bytes, "Dynamic shared memory per CTA (bytes) of sparse_decode_ws");
  m.def("ws_block_rows", &fm_ws_block_rows, "KV rows per tile of sparse_decode_ws (the unit of tiles_per_split)");
  m.def("ws3_smem_bytes", &fm_ws3_smem_bytes, "Dynamic shared memory per CTA (bytes) of sparse_decode_ws variant 3");
  m.def("ws3_block_rows", &fm_ws3_block_rows, "KV rows per tile of sparse_decode_ws variant 3 (64)");
  m.def("ws3_threads", &fm_ws3_threads, "Threads per CTA of sparse_decode_ws variant 3");
  m.def("sparse_decode_ws3_extra", &sparse_decode_ws3_extra,
        "ws3 (fm_ws3_decode.cu) with a second cache: sparse_decode_ws's arguments for variant 3 plus kv2 / idx2 after "
        "idx, topk2 after topk, n_rows2 after n_rows, stride_it2 after stride_it, stride_kv2 (bytes) after stride_kv; "
        "tiles_per_split counts 64-row tiles of the main list followed by the extra list; all-hole tiles are skipped. "
        "No ablation modes.");
  m.def("ws3_smem_bytes_extra", &fm_ws3_smem_bytes_extra, "Dynamic shared memory per CTA of sparse_decode_ws3_extra");
  m.def("sparse_decode_ws3p", &sparse_decode_ws3p,
        "ws3 in a persistent grid (fm_ws3_decode.cu ws3p_decode_kernel): min(SMs or max_ctas, work items) CTAs, each "
        "looping over (token, split, head block) items at a static stride. sparse_decode_ws's arguments with "
        "max_ctas (0: one CTA per SM) in place of variant / mode; tiles_per_split in 64-row tiles.");
  m.def("sparse_decode_ws3p_opt", &sparse_decode_ws3p_opt,
        "ws3p with option flags (session 6): sparse_decode_ws3p's arguments plus opt before stream (bits: 1 FP8 "
        "producer loads a warp's 16 rows at once, 2 lazy O rescale, 4 early scores of the next tile; BF16 ignores "
        "bit 1; 8 one scoring warpgroup, not with 1 / 4; instantiated FP8 0/1/2/4/7/8/10, BF16 0/2/4/6/8/10). Bits 1, 2, 4 keep "
        "sparse_decode_ws3p's results bit for bit; 8 changes the summation order.");
  m.def("sparse_decode_ws3p_vec", &sparse_decode_ws3p_vec,
        "ws3p's kOptVec build (session 9, fm_ws3v_decode.cu): sparse_decode_ws3p_opt's arguments, FP8 cache only, opt "
        "24 = ws3p1 (8) with the lane-uniform FP8 producer (16); results bit-identical to opt 8.");
  // the opts sparse_decode_ws3p_ovl takes (BF16 106; FP8 120, 632 = + kOptVecWide since session 11; 1130 / 1658 =
  // + kOptThresh since session 14)
  m.attr("ws3p_ovl_opts") = pybind11::make_tuple(106, 120, 632, 1130, 1658);
  m.def("sparse_decode_ws3p_ovl", &sparse_decode_ws3p_ovl,
        "ws3p's adaptive overlap builds (session 10, fm_ws3_decode.cu consumer_p1o: the scoring warpgroup issues "
        "S_{i+1} before softmax_i once its tile has landed): sparse_decode_ws3p_opt's arguments, opt BF16 106 "
        "(bit-identical to opt 10), FP8 120 (bit-identical to sparse_decode_ws3p_vec's 24).");
}
