// W4A16 grouped GEMM by "dequantise a chunk of experts to bf16, then CUTLASS's SM90 ptr-array grouped bf16 GEMM"
// (dg_cutlass_w4a16.h has the contract). Why not CUTLASS's mixed-input collective (bf16 x e2m1 with scales in the
// mainloop): sm90_mma_array_tma_gmma_rs_warpspecialized_mixed_input.hpp takes ONE scale per row per k tile
// (`size<1>(SmemLayoutAtomScale{}) == 1`, line 239; scale tile index `k_tile / reload_factor`, line 799), its
// can_implement requires `chunk_size == K || chunk_size % TileK == 0` (line 599) and the bf16 tile needs TileK >= 64
// (`K_BLOCK_MAX >= 4` k-blocks of 16, line 949): a group size of 32 cannot be expressed, and mixed_input_utils.hpp
// has fast converters only for int4 / uint4 sources (lines 81-260), none for float_e2m1_t.
// One template; each w4a16_dq_<name>.cu instantiates one tile config.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass_common.cuh"
#include "dg_cutlass_w4a16.h"
#include "w4a16_dq_decode.h"

namespace dg::cutlass_w4a16_dq {
using namespace cute;

using Element = cutlass::bfloat16_t;  // A, the dequantised B and D
using ElementAcc = float;
constexpr int kAlign = 8;  // bf16 elements per 16-byte TMA row unit (k % 128, n % 16 keep every row aligned)
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

template <class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct GroupedGemm {
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementAcc, void, cutlass::layout::RowMajor*,
      kAlign, Element, cutlass::layout::RowMajor*, kAlign, EpilogueSchedule>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor*, kAlign, Element,
      cutlass::layout::ColumnMajor*, kAlign, ElementAcc, TileShape, ClusterShape,
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

// The per-expert arrays of one chunk, carved out of `aux` (256-byte aligned pieces).
template <class G>
struct Aux {
  Shape3* shapes;
  const Element **a, **b;
  Element** d;
  typename G::StrideA* sa;
  typename G::StrideB* sb;
  typename G::StrideD* sd;
};

using cutlass_common::align_up;
using cutlass_common::carve;

// Pass base == nullptr to measure (*bytes).
template <class G>
Aux<G> carve_aux(char* base, int g, size_t* bytes) {
  char* p = base;
  Aux<G> x;
  x.shapes = carve<Shape3>(p, g);
  x.a = carve<const Element*>(p, g);
  x.b = carve<const Element*>(p, g);
  x.d = carve<Element*>(p, g);
  x.sa = carve<typename G::StrideA>(p, g);
  x.sb = carve<typename G::StrideB>(p, g);
  x.sd = carve<typename G::StrideD>(p, g);
  *bytes = static_cast<size_t>(p - base);
  return x;
}

// Expert e's rows [start, end): offs are END rows, clamped to [0, m] (never validated: that would sync).
__device__ __forceinline__ int2 expert_rows(const int* offs, int e, int m) {
  int start = e == 0 ? 0 : offs[e - 1];
  int end = offs[e];
  start = start < 0 ? 0 : (start > m ? m : start);
  end = end < start ? start : (end > m ? m : end);
  return make_int2(start, end);
}

// One thread per 32-weight scale group: 16 packed bytes + 1 scale byte in, 64 bytes of bf16 out. Block (x, j):
// expert e0 + j of the chunk; experts with no rows return at once (their weights are never read).
static __global__ void dequant_chunk(CutlassW4A16DqArgs p, int e0) {
  int j = blockIdx.y, e = e0 + j;
  int2 rows = expert_rows(reinterpret_cast<const int*>(p.offs), e, p.m);
  if (rows.y <= rows.x) return;
  int64_t groups = static_cast<int64_t>(p.n) * (p.k / 32);
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= groups) return;
  const uint4* src = reinterpret_cast<const uint4*>(p.packed) + static_cast<int64_t>(e) * groups + i;
  uint32_t s = reinterpret_cast<const uint8_t*>(p.scales)[static_cast<int64_t>(e) * groups + i];
  uint4 w = __ldg(src);
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  uint32_t o[16];
  w4a16_dq::dequant_group32(words, s, o);  // exact for scale bytes <= 252 (tests/test_dg_w4a16_dq.py)
  uint4* dst = reinterpret_cast<uint4*>(p.scratch) + (static_cast<int64_t>(j) * groups + i) * 4;
#pragma unroll
  for (int q = 0; q < 4; ++q) dst[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
}

// One thread per expert of the chunk: problem (rows, n, k) and its pointers (rows == 0: an empty problem).
template <class G>
__global__ void setup_chunk(Aux<G> x, CutlassW4A16DqArgs p, int e0, int count) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= count) return;
  int2 rows = expert_rows(reinterpret_cast<const int*>(p.offs), e0 + j, p.m);
  int start = rows.y > rows.x ? rows.x : 0;
  x.shapes[j] = Shape3{rows.y - rows.x, p.n, p.k};
  x.a[j] = reinterpret_cast<const Element*>(p.a) + static_cast<int64_t>(start) * p.k;
  x.b[j] = reinterpret_cast<const Element*>(p.scratch) + static_cast<int64_t>(j) * p.n * p.k;
  x.d[j] = reinterpret_cast<Element*>(p.d) + static_cast<int64_t>(start) * p.n;
  typename G::StrideA sa{};
  typename G::StrideB sb{};
  typename G::StrideD sd{};
  cute::get<0>(sa) = p.k;  // (row stride, unit, batch = static 0 for grouped kernels)
  cute::get<0>(sb) = p.k;
  cute::get<0>(sd) = p.n;
  x.sa[j] = sa;
  x.sb[j] = sb;
  x.sd[j] = sd;
}

template <class G>
typename G::Gemm::Arguments make_args(const Aux<G>& x, int groups, int raster, int swizzle) {
  typename G::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {groups, x.shapes, nullptr},  // device problem shapes only
                                   {x.a, x.sa, x.b, x.sb},
                                   {{}, nullptr, reinterpret_cast<typename G::StrideC*>(x.sd), x.d, x.sd},
                                   cutlass_common::hw_info("deep_gemm CUTLASS W4A16 dq gemm")};
  cutlass_common::set_grouped_epilogue_and_scheduler(args, raster, swizzle);
  return args;
}

inline void check(cutlass::Status st, const char* what) {
  cutlass_common::check_status(st, "deep_gemm CUTLASS W4A16 dq gemm", what);
}

inline void check_cuda(cudaError_t err, const char* what) {
  cutlass_common::check_cuda(err, "deep_gemm CUTLASS W4A16 dq", what);
}

template <class G>
int64_t aux_bytes(int chunk) {
  size_t bytes = 0;
  carve_aux<G>(nullptr, chunk, &bytes);
  return static_cast<int64_t>(bytes);
}

template <class G>
int64_t workspace_size(int chunk) {
  size_t bytes = 0;
  Aux<G> x = carve_aux<G>(nullptr, chunk, &bytes);
  return static_cast<int64_t>(G::Gemm::get_workspace_size(make_args<G>(x, chunk, 0, 1)));
}

template <class G>
void run(const CutlassW4A16DqArgs& p) {
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);
  size_t bytes = 0;
  Aux<G> x = carve_aux<G>(reinterpret_cast<char*>(p.aux), p.chunk, &bytes);
  int64_t groups32 = static_cast<int64_t>(p.n) * (p.k / 32);
  unsigned blocks = static_cast<unsigned>((groups32 + 255) / 256);
  typename G::Gemm gemm;
  for (int e0 = 0; e0 < p.groups; e0 += p.chunk) {
    int count = p.groups - e0 < p.chunk ? p.groups - e0 : p.chunk;
    dequant_chunk<<<dim3(blocks, count), 256, 0, stream>>>(p, e0);
    setup_chunk<G><<<(count + 127) / 128, 128, 0, stream>>>(x, p, e0, count);
    check_cuda(cudaGetLastError(), "dequant / setup");
    auto args = make_args<G>(x, count, p.raster, p.swizzle);
    check(gemm.can_implement(args), "can_implement");
    check(gemm.initialize(args, reinterpret_cast<void*>(p.workspace), stream), "initialize");
    check(gemm.run(stream), "run");
    check_cuda(cudaGetLastError(), "launch");
  }
}

}  // namespace dg::cutlass_w4a16_dq

// One config's entry points (in namespace dg), for w4a16_dq_<name>.cu.
#define DG_CUTLASS_W4A16_DQ_ENTRY(name, G)                                                                        \
  namespace dg {                                                                                                   \
  int64_t cutlass_w4a16_dq_aux_bytes_##name(int chunk) { return cutlass_w4a16_dq::aux_bytes<G>(chunk); }           \
  int64_t cutlass_w4a16_dq_workspace_size_##name(int chunk) { return cutlass_w4a16_dq::workspace_size<G>(chunk); } \
  void cutlass_w4a16_dq_gemm_##name(const CutlassW4A16DqArgs& args) { cutlass_w4a16_dq::run<G>(args); }          \
  }
