// M-grouped contiguous FP8 GEMM (DeepGEMM `m_grouped_fp8_gemm_nt_contiguous` layout) through CUTLASS's SM90 ptr-array
// grouped GEMM with groupwise scaling: 128x128x128 cooperative, cluster 1x2, bf16 out, no C.
//
// Layout: rows of a [M, k] are sorted by expert; m_indices[i] is row i's expert (-1: padding, output row zeroed);
// each expert's valid rows are contiguous. Per call, on the stream: two memsets, a scan kernel (one CTA per row:
// the first/last row of each expert by atomicMin/Max; padding rows zeroed), a setup kernel (one thread per expert:
// problem shape (rows_g, n, k), operand pointers, strides and scale layouts into `aux`), then the grouped GEMM,
// which reads the problem shapes from device memory (no host copy, no sync: CUDA-graph safe).
#include "fp8_gemm_kernel.cuh"
#include "cutlass/gemm/group_array_problem_shape.hpp"

namespace dg {
namespace {
using namespace cute;
using cutlass_fp8::ElementAB;
using cutlass_fp8::ElementAcc;
using cutlass_fp8::ElementOut;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_1, _2, _1>;
using Scales = cutlass_fp8::ScaleConfig</*SfaMMajor=*/false>;  // A scales K-major: the API's [M, k/128] as is
using LayoutSFA = decltype(Scales::deduce_layoutSFA());
using LayoutSFB = decltype(Scales::deduce_layoutSFB());

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, cutlass::layout::RowMajor*,
    cutlass_fp8::kAlignOut, ElementOut, cutlass::layout::RowMajor*, cutlass_fp8::kAlignOut,
    cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
    cutlass_fp8::kAlignAB, ElementAB, cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>, cutlass_fp8::kAlignAB,
    ElementAcc, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
using StrideA = typename Gemm::GemmKernel::InternalStrideA;
using StrideB = typename Gemm::GemmKernel::InternalStrideB;
using StrideC = typename Gemm::GemmKernel::InternalStrideC;
using StrideD = typename Gemm::GemmKernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// The per-expert arrays the grouped kernel reads, carved out of one `aux` buffer (256-byte aligned pieces).
struct Aux {
  int *first, *last;  // first valid row / last valid row + 1 of each expert (scan kernel)
  Shape3* shapes;
  const ElementAB **a, **b;
  const ElementAcc **sfa, **sfb;
  ElementOut** d;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
  LayoutSFA* lsfa;
  LayoutSFB* lsfb;
};

inline size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

template <class T>
T* carve(char*& p, int g) {
  T* out = reinterpret_cast<T*>(p);
  p += align_up(sizeof(T) * static_cast<size_t>(g));
  return out;
}

// Pass base == nullptr to measure: the returned pointer's value is the byte count.
inline Aux carve_aux(char* base, int g, size_t* bytes) {
  char* p = base;
  Aux x;
  x.first = carve<int>(p, g);
  x.last = carve<int>(p, g);
  x.shapes = carve<Shape3>(p, g);
  x.a = carve<const ElementAB*>(p, g);
  x.b = carve<const ElementAB*>(p, g);
  x.sfa = carve<const ElementAcc*>(p, g);
  x.sfb = carve<const ElementAcc*>(p, g);
  x.d = carve<ElementOut*>(p, g);
  x.sa = carve<StrideA>(p, g);
  x.sb = carve<StrideB>(p, g);
  x.sd = carve<StrideD>(p, g);
  x.lsfa = carve<LayoutSFA>(p, g);
  x.lsfb = carve<LayoutSFB>(p, g);
  *bytes = static_cast<size_t>(p - base);
  return x;
}

// One CTA per row: record the expert's row range, or zero a padding row of the output.
__global__ void scan_rows(const int* m_indices, int* first, int* last, ElementOut* d, int n) {
  int row = blockIdx.x;
  int e = m_indices[row];
  if (e >= 0) {
    if (threadIdx.x == 0) {
      atomicMin(first + e, row);
      atomicMax(last + e, row + 1);
    }
    return;
  }
  ElementOut* out = d + static_cast<int64_t>(row) * n;
  for (int j = threadIdx.x; j < n; j += blockDim.x) out[j] = ElementOut(0.0f);
}

template <class Stride>
__device__ Stride row_major(int64_t ld) {
  Stride s{};
  cute::get<0>(s) = ld;  // (row stride, unit, batch = static 0 for grouped kernels)
  return s;
}

// One thread per expert: its problem and pointers (an expert without rows gets an empty problem).
__global__ void setup_groups(Aux x, CutlassFp8GroupedArgs p) {
  int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= p.groups) return;
  int start = x.first[g], end = x.last[g];
  int rows = end > start ? end - start : 0;
  if (rows == 0) start = 0;
  int kb = p.k / 128, nb = (p.n + 127) / 128;
  x.shapes[g] = Shape3{rows, p.n, p.k};
  x.a[g] = reinterpret_cast<const ElementAB*>(p.a) + static_cast<int64_t>(start) * p.k;
  x.b[g] = reinterpret_cast<const ElementAB*>(p.b) + static_cast<int64_t>(g) * p.n * p.k;
  x.sfa[g] = reinterpret_cast<const ElementAcc*>(p.sfa) + static_cast<int64_t>(start) * kb;
  x.sfb[g] = reinterpret_cast<const ElementAcc*>(p.sfb) + static_cast<int64_t>(g) * nb * kb;
  x.d[g] = reinterpret_cast<ElementOut*>(p.d) + static_cast<int64_t>(start) * p.n;
  x.sa[g] = row_major<StrideA>(p.k);
  x.sb[g] = row_major<StrideB>(p.k);
  x.sd[g] = row_major<StrideD>(p.n);
  x.lsfa[g] = Scales::tile_atom_to_shape_SFA(make_shape(rows, p.n, p.k, 1));
  x.lsfb[g] = Scales::tile_atom_to_shape_SFB(make_shape(rows, p.n, p.k, 1));
}

typename Gemm::Arguments make_args(const Aux& x, int groups) {
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = cutlass_fp8::sm_count();
  if (hw.sm_count <= 0) throw std::runtime_error("deep_gemm CUTLASS grouped fp8 gemm: no CUDA device");
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {groups, x.shapes, nullptr},  // no host problem shapes: the kernel reads the device ones
      {x.a, x.sa, x.b, x.sb, x.sfa, x.lsfa, x.sfb, x.lsfb},
      {{}, nullptr, reinterpret_cast<StrideC*>(x.sd), x.d, x.sd},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  return args;
}

void check(cutlass::Status st, const char* what) {
  if (st != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("deep_gemm CUTLASS grouped fp8 gemm: ") + what + " failed (" +
                             cutlassGetStatusString(st) + ")");
  }
}
}  // namespace

int64_t cutlass_fp8_grouped_aux_bytes(int groups) {
  size_t bytes = 0;
  carve_aux(nullptr, groups, &bytes);
  return static_cast<int64_t>(bytes);
}

int64_t cutlass_fp8_grouped_workspace_size(int groups) {
  size_t bytes = 0;
  Aux x = carve_aux(nullptr, groups, &bytes);
  return static_cast<int64_t>(Gemm::get_workspace_size(make_args(x, groups)));
}

void cutlass_fp8_grouped_gemm(const CutlassFp8GroupedArgs& p) {
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);
  size_t bytes = 0;
  Aux x = carve_aux(reinterpret_cast<char*>(p.aux), p.groups, &bytes);
  size_t idx_bytes = sizeof(int) * static_cast<size_t>(p.groups);
  if (cudaMemsetAsync(x.first, 0x7f, idx_bytes, stream) != cudaSuccess ||
      cudaMemsetAsync(x.last, 0, idx_bytes, stream) != cudaSuccess) {
    throw std::runtime_error("deep_gemm CUTLASS grouped fp8 gemm: cudaMemsetAsync failed");
  }
  if (p.rows > 0) {
    scan_rows<<<p.rows, 128, 0, stream>>>(reinterpret_cast<const int*>(p.m_indices), x.first, x.last,
                                          reinterpret_cast<ElementOut*>(p.d), p.n);
  }
  setup_groups<<<(p.groups + 127) / 128, 128, 0, stream>>>(x, p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("deep_gemm CUTLASS grouped fp8 setup: ") + cudaGetErrorString(err));
  }
  Gemm gemm;
  auto args = make_args(x, p.groups);
  check(gemm.can_implement(args), "can_implement");
  check(gemm.initialize(args, reinterpret_cast<void*>(p.workspace), stream), "initialize");
  check(gemm.run(stream), "run");
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("deep_gemm CUTLASS grouped fp8 gemm launch: ") + cudaGetErrorString(err));
  }
}

}  // namespace dg
