// M-grouped FP8 GEMM (DeepGEMM `m_grouped_fp8_gemm_nt_contiguous` / `_masked` layouts) through CUTLASS's SM90
// ptr-array grouped GEMM with groupwise scaling (A 1x128, B 128x128), bf16 out, no C. One template; each
// fp8_grouped_c<N>.cu instantiates one tile config (dg_cutlass_fp8.h lists them).
//
// Per call, all on the stream (no host copy, no sync: CUDA-graph safe):
//   contiguous: a memset of the per-expert row ranges, a scan kernel (one warp per row: an expert's first / last row
//     from the run boundaries of m_indices, atomics only there; padding rows -1 and ids >= groups zeroed), a setup
//     kernel (one CTA per expert: problem (rows_e, n, k), operand pointers, strides, scale layouts into `aux`);
//     an expert whose rows are NOT contiguous (more than one run) gets an empty problem and its rows are written NaN
//     (the CUTLASS path needs DeepGEMM's layout; NaN makes a wrong layout loud instead of silently wrong);
//   masked: the setup kernel only (expert e: rows min(max(masked_m[e], 0), m_max) at offset e * m_max);
// then the grouped GEMM, which reads the problem shapes from device memory.
#pragma once

#include <cstdint>

#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "fp8_gemm_kernel.cuh"

namespace dg::cutlass_fp8_grouped {
using namespace cute;
using cutlass_fp8::ElementAB;
using cutlass_fp8::ElementAcc;
using cutlass_fp8::ElementOut;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;
using Scales = cutlass_fp8::ScaleConfig</*SfaMMajor=*/false>;  // A scales K-major: the API's [rows, k/128] as is
using LayoutSFA = decltype(Scales::deduce_layoutSFA());
using LayoutSFB = decltype(Scales::deduce_layoutSFB());

template <class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct GroupedGemm {
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, cutlass::layout::RowMajor*,
      cutlass_fp8::kAlignOut, ElementOut, cutlass::layout::RowMajor*, cutlass_fp8::kAlignOut,
      EpilogueSchedule>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
      cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>, cutlass_fp8::kAlignAB, ElementAB,
      cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>, cutlass_fp8::kAlignAB, ElementAcc, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Gemm::GemmKernel::InternalStrideA;
  using StrideB = typename Gemm::GemmKernel::InternalStrideB;
  using StrideC = typename Gemm::GemmKernel::InternalStrideC;
  using StrideD = typename Gemm::GemmKernel::InternalStrideD;
};

// The per-expert arrays the grouped kernel reads, carved out of one `aux` buffer (256-byte aligned pieces).
template <class G>
struct Aux {
  int *first, *last, *runs;  // contiguous only: first row / last row + 1 / number of row runs of each expert
  Shape3* shapes;
  const ElementAB **a, **b;
  const ElementAcc **sfa, **sfb;
  ElementOut** d;
  typename G::StrideA* sa;
  typename G::StrideB* sb;
  typename G::StrideD* sd;
  LayoutSFA* lsfa;
  LayoutSFB* lsfb;
};

using cutlass_common::align_up;
using cutlass_common::carve;

// Pass base == nullptr to measure (*bytes). first, last and runs come first and in that order: one memset of
// 0x7f bytes covers `first`, one of zeros covers `last` and `runs`.
template <class G>
Aux<G> carve_aux(char* base, int g, size_t* bytes) {
  char* p = base;
  Aux<G> x;
  x.first = carve<int>(p, g);
  x.last = carve<int>(p, g);
  x.runs = carve<int>(p, g);
  x.shapes = carve<Shape3>(p, g);
  x.a = carve<const ElementAB*>(p, g);
  x.b = carve<const ElementAB*>(p, g);
  x.sfa = carve<const ElementAcc*>(p, g);
  x.sfb = carve<const ElementAcc*>(p, g);
  x.d = carve<ElementOut*>(p, g);
  x.sa = carve<typename G::StrideA>(p, g);
  x.sb = carve<typename G::StrideB>(p, g);
  x.sd = carve<typename G::StrideD>(p, g);
  x.lsfa = carve<LayoutSFA>(p, g);
  x.lsfb = carve<LayoutSFB>(p, g);
  *bytes = static_cast<size_t>(p - base);
  return x;
}

constexpr int kScanWarps = 8;  // rows per CTA of the scan kernel (one warp each)

// Writes `value` to the n bf16 of one output row with the 32 lanes of a warp (16-byte stores: n % 8 == 0).
__device__ __forceinline__ void fill_row(ElementOut* row, int n, float value, int lane) {
  ElementOut v(value);
  uint16_t bits = reinterpret_cast<const uint16_t&>(v);
  uint32_t w = bits | (static_cast<uint32_t>(bits) << 16);
  uint4 pack = make_uint4(w, w, w, w);
  uint4* out = reinterpret_cast<uint4*>(row);
  for (int j = lane; j < n / 8; j += 32) out[j] = pack;
}

// One warp per row: record the run boundaries of the row's expert, or zero the row (padding -1, or an id outside
// [0, groups): not validated on this path, which would need a host sync).
template <class G>
__global__ void scan_rows(const int* __restrict__ ids, int rows, int groups, Aux<G> x, ElementOut* d, int n) {
  int row = blockIdx.x * kScanWarps + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  int e = ids[row];
  if (e < 0 || e >= groups) {
    fill_row(d + static_cast<int64_t>(row) * n, n, 0.0f, lane);
    return;
  }
  if (lane == 0 && (row == 0 || ids[row - 1] != e)) {
    atomicMin(x.first + e, row);
    atomicAdd(x.runs + e, 1);
  }
  if (lane == 1 && (row == rows - 1 || ids[row + 1] != e)) atomicMax(x.last + e, row + 1);
}

// Problem e: `rows` rows starting at row `start` of a / sfa / d (rows == 0: an empty problem at the base).
template <class G>
__device__ void set_problem(Aux<G>& x, const CutlassFp8GroupedArgs& p, int e, int start, int rows) {
  int kb = p.k / 128, nb = (p.n + 127) / 128;
  if (rows == 0) start = 0;
  x.shapes[e] = Shape3{rows, p.n, p.k};
  x.a[e] = reinterpret_cast<const ElementAB*>(p.a) + static_cast<int64_t>(start) * p.k;
  x.b[e] = reinterpret_cast<const ElementAB*>(p.b) + static_cast<int64_t>(e) * p.n * p.k;
  x.sfa[e] = reinterpret_cast<const ElementAcc*>(p.sfa) + static_cast<int64_t>(start) * kb;
  x.sfb[e] = reinterpret_cast<const ElementAcc*>(p.sfb) + static_cast<int64_t>(e) * nb * kb;
  x.d[e] = reinterpret_cast<ElementOut*>(p.d) + static_cast<int64_t>(start) * p.n;
  typename G::StrideA sa{};
  typename G::StrideB sb{};
  typename G::StrideD sd{};
  cute::get<0>(sa) = p.k;  // (row stride, unit, batch = static 0 for grouped kernels)
  cute::get<0>(sb) = p.k;
  cute::get<0>(sd) = p.n;
  x.sa[e] = sa;
  x.sb[e] = sb;
  x.sd[e] = sd;
  x.lsfa[e] = Scales::tile_atom_to_shape_SFA(make_shape(rows, p.n, p.k, 1));
  x.lsfb[e] = Scales::tile_atom_to_shape_SFB(make_shape(rows, p.n, p.k, 1));
}

// One CTA per expert. A non-contiguous expert (runs > 1) gets an empty problem; its rows become NaN.
template <class G>
__global__ void setup_contiguous(Aux<G> x, CutlassFp8GroupedArgs p) {
  int e = blockIdx.x;
  int start = x.first[e], end = x.last[e], runs = x.runs[e];
  bool ok = runs <= 1;
  if (threadIdx.x == 0) set_problem(x, p, e, start, ok && end > start ? end - start : 0);
  if (ok) return;
  const int* ids = reinterpret_cast<const int*>(p.m_indices);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = start + warp; r < end; r += blockDim.x / 32) {
    if (ids[r] == e) fill_row(reinterpret_cast<ElementOut*>(p.d) + static_cast<int64_t>(r) * p.n, p.n, NAN, lane);
  }
}

// One thread per expert: masked layout, expert e's rows at e * m_max, count clamped to [0, m_max].
template <class G>
__global__ void setup_masked(Aux<G> x, CutlassFp8GroupedArgs p) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= p.groups) return;
  int cnt = reinterpret_cast<const int*>(p.m_indices)[e];
  cnt = cnt < 0 ? 0 : (cnt > p.m_max ? p.m_max : cnt);
  set_problem(x, p, e, e * p.m_max, cnt);
}

template <class G>
typename G::Gemm::Arguments make_args(const Aux<G>& x, int groups, int raster, int swizzle) {
  typename G::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {groups, x.shapes, nullptr},  // no host problem shapes: the kernel reads the device ones
      {x.a, x.sa, x.b, x.sb, x.sfa, x.lsfa, x.sfb, x.lsfb},
      {{}, nullptr, reinterpret_cast<typename G::StrideC*>(x.sd), x.d, x.sd},
      cutlass_common::hw_info("deep_gemm CUTLASS grouped fp8 gemm")};
  cutlass_common::set_grouped_epilogue_and_scheduler(args, raster, swizzle);
  return args;
}

inline void check(cutlass::Status st, const char* what) {
  cutlass_common::check_status(st, "deep_gemm CUTLASS grouped fp8 gemm", what);
}

inline void check_cuda(cudaError_t err, const char* what) {
  cutlass_common::check_cuda(err, "deep_gemm CUTLASS grouped fp8", what);
}

template <class G>
int64_t aux_bytes(int groups) {
  size_t bytes = 0;
  carve_aux<G>(nullptr, groups, &bytes);
  return static_cast<int64_t>(bytes);
}

template <class G>
int64_t workspace_size(int groups) {
  size_t bytes = 0;
  Aux<G> x = carve_aux<G>(nullptr, groups, &bytes);
  return static_cast<int64_t>(G::Gemm::get_workspace_size(make_args<G>(x, groups, 0, 1)));
}

template <class G>
void run(const CutlassFp8GroupedArgs& p) {
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);
  size_t bytes = 0;
  Aux<G> x = carve_aux<G>(reinterpret_cast<char*>(p.aux), p.groups, &bytes);
  if (p.masked) {
    setup_masked<G><<<(p.groups + 127) / 128, 128, 0, stream>>>(x, p);
  } else {
    size_t piece = align_up(sizeof(int) * static_cast<size_t>(p.groups));  // first | last | runs, each `piece`
    check_cuda(cudaMemsetAsync(x.first, 0x7f, piece, stream), "memset");
    check_cuda(cudaMemsetAsync(x.last, 0, 2 * piece, stream), "memset");
    if (p.rows > 0) {
      scan_rows<G><<<(p.rows + kScanWarps - 1) / kScanWarps, 32 * kScanWarps, 0, stream>>>(
          reinterpret_cast<const int*>(p.m_indices), p.rows, p.groups, x, reinterpret_cast<ElementOut*>(p.d), p.n);
    }
    setup_contiguous<G><<<p.groups, 128, 0, stream>>>(x, p);
  }
  check_cuda(cudaGetLastError(), "setup");
  typename G::Gemm gemm;
  auto args = make_args<G>(x, p.groups, p.raster, p.swizzle);
  check(gemm.can_implement(args), "can_implement");
  check(gemm.initialize(args, reinterpret_cast<void*>(p.workspace), stream), "initialize");
  check(gemm.run(stream), "run");
  check_cuda(cudaGetLastError(), "launch");
}

}  // namespace dg::cutlass_fp8_grouped

// One config's entry points (in namespace dg), for fp8_grouped_c<N>.cu.
#define DG_CUTLASS_FP8_GROUPED_ENTRY(name, G)                                                                      \
  namespace dg {                                                                                                   \
  int64_t cutlass_fp8_grouped_aux_bytes_##name(int groups) { return cutlass_fp8_grouped::aux_bytes<G>(groups); }   \
  int64_t cutlass_fp8_grouped_workspace_size_##name(int groups) {                                                  \
    return cutlass_fp8_grouped::workspace_size<G>(groups);                                                         \
  }                                                                                                                \
  void cutlass_fp8_grouped_gemm_##name(const CutlassFp8GroupedArgs& args) { cutlass_fp8_grouped::run<G>(args); } \
  }
