// Launchers of the FP8 block-scaled grouped GEMM with double-buffered promotion (kernels and numerics: dg_fp8_db.cuh,
// dg_fp8_tma.cuh).
#include "dg_fp8_db.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled (the driver entry point is looked up at run time)

#include <cstdio>

#include "dg_fp8_tma.cuh"  // (includes dg_fp8_db.cuh)
#include "dg_w4a8_wide.cuh"
#include "dg_launch.h"

namespace dg_fp8db {
namespace {

constexpr int kStaggerNs = 1000;  // ~2 k blocks of one CTA at full rate (stagger = 1)

// Opt in to the largest shared memory any g <= kMaxGroups needs, once per device and kernel (a launch under CUDA-graph
// capture then only launches); returns the SM count.
template <int NS, int STAGGER, bool TMA = false, bool WIDE = false>
cudaError_t opt_in(int* sms) {
  if constexpr (WIDE) {
    return dg_launch::opt_in_smem_once<fp8_wide_kernel<NS>>(WideLayout<NS>::bytes(kMaxGroups), sms);
  } else if constexpr (TMA) {
    return dg_launch::opt_in_smem_once<fp8_db_tma_kernel<NS>>(DbLayout<NS>::bytes(kMaxGroups), sms);
  } else {
    return dg_launch::opt_in_smem_once<fp8_db_kernel<NS, STAGGER>>(DbLayout<NS>::bytes(kMaxGroups), sms);
  }
}

template <int NS, int STAGGER = 0>
int launch(const DbParams& p, int ctas, cudaStream_t stream, std::string* msg) {
  int sms = 0;
  const int smem = DbLayout<NS>::bytes(p.g);
  cudaError_t err = opt_in<NS, STAGGER>(&sms);
  if (err == cudaSuccess) {
    if (ctas <= 0) ctas = sms;  // one 384-thread CTA per SM (the ring takes most of the shared memory)
    fp8_db_kernel<NS, STAGGER><<<ctas, kThreads, smem, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess && msg != nullptr) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "fp8_db stages=%d stagger=%d smem=%d ctas=%d: %s", NS, STAGGER, smem, ctas,
                  cudaGetErrorString(err));
    *msg = buf;
  }
  return static_cast<int>(err);
}

// cuTensorMapEncodeTiled from the driver through the runtime (no libcuda link); nullptr when unavailable.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    const bool ok = err == cudaSuccess && q == cudaDriverEntryPointSuccess && f != nullptr;
    return ok ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f) : nullptr;
  }();
  return fn;
}

// map <- the uint8 [rows, k] row-major matrix at base, box [box_rows, 128 k], 128-byte swizzle (the layout gmma_desc
// reads; k bytes = 128 = the swizzle span; a 256-row box is two 128-row boxes back to back: the swizzle phase is the
// row index mod 8), rows past `rows` zero-filled. box_rows <= 256 (TMA's box limit). Returns a CUresult (0: success).
int encode_kmajor(CUtensorMap* map, const void* base, int rows, int k, int box_rows = kBM) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  if (fn == nullptr) return -1;
  const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)k};  // bytes between rows (the innermost stride is implied)
  const cuuint32_t box[2] = {(cuuint32_t)kBK, (cuuint32_t)box_rows}, elem[2] = {1, 1};
  return static_cast<int>(fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, elem,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

// The tensor maps of a TMA-producer launch: A [m, k] and B [g * n, k] (box rows: 256 for WIDE). Returns the failing
// map's name, or nullptr.
template <bool WIDE>
const char* encode_maps(DbMaps* maps, const DbParams& p, int* res) {
  *res = encode_kmajor(&maps->a, p.a, p.m, p.k);
  if (*res != 0) return "A";
  *res = encode_kmajor(&maps->b, p.b, p.g * p.n, p.k, WIDE ? 2 * kBN : kBN);
  if (*res != 0) return "B";
  return nullptr;
}

// The TMA-producer kernels: tensor maps built per call (host only, ~us; passed by value, so a CUDA-graph capture
// keeps them). WIDE: fp8_wide_kernel (B box 256 rows), else fp8_db_tma_kernel.
template <int NS, bool WIDE = false>
int launch_tma(const DbParams& p, int ctas, cudaStream_t stream, std::string* msg) {
  const char* kind = WIDE ? "fp8_wide" : "fp8_db tma";
  DbMaps maps;
  int res = 0;
  const char* which = encode_maps<WIDE>(&maps, p, &res);
  if (res != 0) {
    if (msg != nullptr) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "%s stages=%d: cuTensorMapEncodeTiled of %s failed (%s %d)", kind, NS, which,
                    res == -1 ? "entry point not found" : "CUresult", res);
      *msg = buf;
    }
    return static_cast<int>(cudaErrorInvalidValue);
  }
  int sms = 0;
  const int smem = WIDE ? WideLayout<NS>::bytes(p.g) : DbLayout<NS>::bytes(p.g);
  cudaError_t err = opt_in<NS, 0, true, WIDE>(&sms);
  if (err == cudaSuccess) {
    if (ctas <= 0) ctas = sms;
    if constexpr (WIDE) {
      fp8_wide_kernel<NS><<<ctas, kThreads, smem, stream>>>(p, maps);
    } else {
      fp8_db_tma_kernel<NS><<<ctas, kThreads, smem, stream>>>(p, maps);
    }
    err = cudaGetLastError();
  }
  if (err != cudaSuccess && msg != nullptr) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "%s stages=%d smem=%d ctas=%d: %s", kind, NS, smem, ctas,
                  cudaGetErrorString(err));
    *msg = buf;
  }
  return static_cast<int>(err);
}

// The W4A8 wide kernel (tma mode 4, dg_w4a8_wide.cuh): only the A map (p.b = the prepared chunks, read by bulk
// copies); fixed shared memory (the raw slots sit past the largest prefix).
int launch_w4(const DbParams& p, int ctas, cudaStream_t stream, std::string* msg) {
  CUtensorMap map_a;
  const int res = encode_kmajor(&map_a, p.a, p.m, p.k);
  cudaError_t err = res == 0 ? cudaSuccess : cudaErrorInvalidValue;
  int sms = 0;
  if (err == cudaSuccess) err = dg_launch::opt_in_smem_once<w4a8_wide_kernel>(W4Layout::kBytes, &sms);
  if (err == cudaSuccess) {
    if (ctas <= 0) ctas = sms;
    w4a8_wide_kernel<<<ctas, kThreads, W4Layout::kBytes, stream>>>(p, map_a);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess && msg != nullptr) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "w4a8_wide ctas=%d: %s (tensor map of A: %d)", ctas, cudaGetErrorString(err),
                  res);
    *msg = buf;
  }
  return static_cast<int>(err);
}

}  // namespace

std::vector<std::tuple<int, int, int>> fp8_db_variants() {
  return {{4, 0, 0}, {5, 0, 0}, {5, 1, 0}, {4, 0, 1}, {5, 0, 1}, {4, 0, 2}, {3, 0, 2}, {3, 0, 4}};
}

int fp8_db_smem_bytes(int stages, int g, int tma) {
  if (tma == 4) return stages == kW4Stages ? W4Layout::kBytes : -1;  // the W4A8 wide kernel: fixed
  if (tma == 2) {
    if (stages == 4) return WideLayout<4>::bytes(g);
    if (stages == 3) return WideLayout<3>::bytes(g);
    return -1;
  }
  if (stages == 4) return DbLayout<4>::bytes(g);
  if (stages == 5) return DbLayout<5>::bytes(g);
  return -1;
}

int fp8_db_launch(int stages, int stagger, int tma, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t b,
                  std::uintptr_t sfb, std::uintptr_t offs, std::uintptr_t out, int m, int n, int k, int g, int ctas,
                  std::uintptr_t stream, std::string* msg) {
  if (m < 0 || n <= 0 || k <= 0 || n % kBN != 0 || k % kBK != 0 || g < 1 || g > kMaxGroups) {
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "fp8_db: expected m >= 0, n > 0 and n %% 128 == 0, k > 0 and k %% 128 == 0, 1 <= g <= %d; got m=%d "
                  "n=%d k=%d g=%d",
                  kMaxGroups, m, n, k, g);
    *msg = buf;
    return -2;
  }
  if (tma == 4 && g > kW4MaxGroups) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "w4a8_wide (tma=4): expected at most %d groups, got g=%d", kW4MaxGroups, g);
    *msg = buf;
    return -2;
  }
  if ((tma == 2 || tma == 4) && n % (2 * kBN) != 0) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "%s (tma=%d, 128 x 256 tiles): expected n %% 256 == 0, got n=%d",
                  tma == 4 ? "w4a8_wide" : "fp8_wide", tma, n);
    *msg = buf;
    return -2;
  }
  if (m == 0) return 0;
  DbParams p{reinterpret_cast<const uint8_t*>(a), reinterpret_cast<const float*>(sfa),
             reinterpret_cast<const uint8_t*>(b), reinterpret_cast<const float*>(sfb),
             reinterpret_cast<const int*>(offs), reinterpret_cast<__nv_bfloat16_raw*>(out), m, n, k, g};
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (tma != 0) {
    if (stages == 4 && stagger == 0 && tma == 1) return launch_tma<4>(p, ctas, s, msg);
    if (stages == 5 && stagger == 0 && tma == 1) return launch_tma<5>(p, ctas, s, msg);
    if (stages == 4 && stagger == 0 && tma == 2) return launch_tma<4, true>(p, ctas, s, msg);
    if (stages == 3 && stagger == 0 && tma == 2) return launch_tma<3, true>(p, ctas, s, msg);
    if (stages == kW4Stages && stagger == 0 && tma == 4) return launch_w4(p, ctas, s, msg);
    return -1;
  }
  if (stages == 4 && stagger == 0) return launch<4>(p, ctas, s, msg);
  if (stages == 5 && stagger == 0) return launch<5>(p, ctas, s, msg);
  if (stages == 5 && stagger == 1) return launch<5, kStaggerNs>(p, ctas, s, msg);
  return -1;
}

}  // namespace dg_fp8db
