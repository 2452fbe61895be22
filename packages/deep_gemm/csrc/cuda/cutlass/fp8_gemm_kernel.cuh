// CUTLASS 3.x (CuTe) SM90 warp-specialised FP8 GEMM with groupwise scaling (A 1x128, B 128x128), bf16 out.
// One template; each .cu instantiates one tile config. Only included by the CUTLASS translation units.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "dg_cutlass_fp8.h"
#include "cutlass_common.cuh"

namespace dg::cutlass_fp8 {

using namespace cute;

using ElementAB = cutlass::float_e4m3_t;
using ElementOut = cutlass::bfloat16_t;  // both C and D: C is bf16 or absent (Python falls back otherwise)
using ElementAcc = float;                // must equal the block-scale element type (CUTLASS static_assert)
constexpr int kAlignAB = 16;             // elements of 1 byte: 16-byte TMA rows
constexpr int kAlignOut = 8;             // bf16: 16-byte rows, hence n % 8 == 0

// A scales M-major (TMA-loaded for tiles of >= 32 rows) or K-major (the API's [m, k/128] as is, cp.async by the
// producer's 32 scale threads, which load the K-major B scales anyway); B scales K-major = the API's [n/128, k/128].
template <bool SfaMMajor>
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<
    1, 128, 128, SfaMMajor ? cute::GMMA::Major::MN : cute::GMMA::Major::K, cute::GMMA::Major::K>;

// Sets the tile scheduler's runtime knobs; the stream-K ones only where the scheduler has them.
template <class T, class = void>
struct HasDecomposition : std::false_type {};
template <class T>
struct HasDecomposition<T, std::void_t<decltype(std::declval<T&>().decomposition_mode)>> : std::true_type {};

template <class SchedulerArgs>
void set_scheduler(SchedulerArgs& s, const CutlassFp8Args& p) {
  s.max_swizzle_size = p.swizzle;
  s.raster_order = static_cast<decltype(s.raster_order)>(p.raster);
  if constexpr (HasDecomposition<SchedulerArgs>::value) {
    s.decomposition_mode = static_cast<decltype(s.decomposition_mode)>(p.decomposition);
    s.splits = p.splits;
  }
}

template <class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule, class Scheduler,
          bool SfaMMajor>
struct Fp8Gemm {
  static constexpr bool kSfaMMajor = SfaMMajor;
  using Scales = ScaleConfig<SfaMMajor>;
  using LayoutSFA = decltype(Scales::deduce_layoutSFA());
  using LayoutSFB = decltype(Scales::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, ElementOut, cutlass::layout::RowMajor,
      kAlignOut, ElementOut, cutlass::layout::RowMajor, kAlignOut, EpilogueSchedule>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
      cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, kAlignAB, ElementAB,
      cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, kAlignAB, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Arguments = typename Gemm::Arguments;
};

using cutlass_common::sm_count;  // SM count per device, queried once (cutlass_common.cuh)

// The layout of the M-major A scales [k/128, sfa_ld]: element (i, kb) at kb * sfa_ld + i. Built by hand because
// tile_atom_to_shape_SFA would use stride m, which breaks TMA's 16-byte stride rule for m % 4 != 0. The M extent is
// sfa_ld (not m) too: can_implement requires it to be a multiple of 4; rows m..sfa_ld-1 (zeroed by the Python side)
// only scale accumulator rows >= m, which the epilogue never stores. K-major: CUTLASS's own [m, k/128] layout.
template <class G>
typename G::LayoutSFA make_layout_sfa(int m, int n, int k, int sfa_ld) {
  if constexpr (G::kSfaMMajor) {
    int kb = k / 128;
    return make_layout(make_shape(make_shape(_1{}, sfa_ld), make_shape(_128{}, kb), 1),
                       make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, sfa_ld), sfa_ld * kb));
  } else {
    return G::Scales::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
  }
}

// Packed stride of a [rows, ld] row-major operand in CUTLASS's (row, contiguous, batch) form: (ld, 1, rows*ld).
// (cutlass/util/packed_stride.hpp lives in CUTLASS's tools/, which the header-only install does not carry.)
template <class Stride>
Stride packed_stride(int rows, int ld) {
  static_assert(cute::is_static_v<cute::remove_cvref_t<decltype(cute::get<1>(Stride{}))>>, "expected unit stride in mode 1");
  Stride s{};
  cute::get<0>(s) = static_cast<int64_t>(ld);
  cute::get<2>(s) = static_cast<int64_t>(rows) * ld;
  return s;
}

template <class G>
typename G::Arguments make_arguments(const CutlassFp8Args& p) {
  using Gemm = typename G::Gemm;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  auto stride_a = packed_stride<StrideA>(p.m, p.k);
  auto stride_b = packed_stride<StrideB>(p.n, p.k);
  auto stride_c = packed_stride<StrideC>(p.m, p.n);
  auto stride_d = packed_stride<StrideD>(p.m, p.n);
  auto layout_sfa = make_layout_sfa<G>(p.m, p.n, p.k, p.sfa_ld);
  auto layout_sfb = G::Scales::tile_atom_to_shape_SFB(make_shape(p.m, p.n, p.k, 1));

  cutlass::KernelHardwareInfo hw;
  hw.sm_count = sm_count();
  if (hw.sm_count <= 0) {  // the stream-K sizing divides by it
    throw std::runtime_error("deep_gemm CUTLASS fp8 gemm: no CUDA device (SM count query failed)");
  }
  typename G::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {p.m, p.n, p.k, 1},
      {reinterpret_cast<const ElementAB*>(p.a), stride_a, reinterpret_cast<const ElementAB*>(p.b), stride_b,
       reinterpret_cast<const ElementAcc*>(p.sfa), layout_sfa, reinterpret_cast<const ElementAcc*>(p.sfb),
       layout_sfb},
      {{}, reinterpret_cast<const ElementOut*>(p.c), stride_c, reinterpret_cast<ElementOut*>(p.d), stride_d},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = p.beta;
  set_scheduler(args.scheduler, p);
  return args;
}

template <class G>
int64_t workspace_size(const CutlassFp8Args& shape_and_knobs) {
  CutlassFp8Args p = shape_and_knobs;
  p.sfa_ld = (p.m + 3) / 4 * 4;
  auto args = make_arguments<G>(p);
  return static_cast<int64_t>(G::Gemm::get_workspace_size(args));
}

inline void check(cutlass::Status st, const char* what, const CutlassFp8Args& p) {
  if (st != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("deep_gemm CUTLASS fp8 gemm: ") + what + " failed (" +
                             cutlassGetStatusString(st) + ") for m=" + std::to_string(p.m) +
                             " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k));
  }
}

template <class G>
void run(const CutlassFp8Args& p) {
  typename G::Gemm gemm;
  auto args = make_arguments<G>(p);
  check(gemm.can_implement(args), "can_implement", p);
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);
  check(gemm.initialize(args, reinterpret_cast<void*>(p.workspace), stream), "initialize", p);
  check(gemm.run(stream), "run", p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("deep_gemm CUTLASS fp8 gemm launch: ") + cudaGetErrorString(err));
  }
}

}  // namespace dg::cutlass_fp8
