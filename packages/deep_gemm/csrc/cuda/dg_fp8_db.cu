// Launchers of the FP8 block-scaled grouped GEMM with double-buffered promotion (kernel and numerics: dg_fp8_db.cuh).
#include "dg_fp8_db.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled (the driver entry point is looked up at run time)

#include <cstdio>

#include "dg_fp8_db.cuh"
#include "dg_launch.h"

namespace dg_fp8db {
namespace {

constexpr int kStaggerNs = 1000;  // ~2 k blocks of one CTA at full rate (stagger = 1)

// Opt in to the largest shared memory any g <= kMaxGroups needs, once per device and kernel (a launch under CUDA-graph
// capture then only launches); returns the SM count.
template <int NS, int STAGGER, bool TMA = false>
cudaError_t opt_in(int* sms) {
  if constexpr (TMA) {
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

// map <- the uint8 [rows, k] row-major matrix at base, box [128 rows, 128 k], 128-byte swizzle (the layout gmma_desc
// reads; k bytes = 128 = the swizzle span), rows past `rows` zero-filled. Returns a CUresult (0: success).
int encode_kmajor(CUtensorMap* map, const void* base, int rows, int k) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  if (fn == nullptr) return -1;
  const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)k};  // bytes between rows (the innermost stride is implied)
  const cuuint32_t box[2] = {(cuuint32_t)kBK, (cuuint32_t)kBM}, elem[2] = {1, 1};
  static_assert(kBM == kBN, "one box shape for A and B");
  return static_cast<int>(fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, elem,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

// The TMA-producer kernel: tensor maps of A [m, k] and B [g * n, k] built per call (host only, ~us; passed by value,
// so a CUDA-graph capture keeps them).
template <int NS>
int launch_tma(const DbParams& p, int ctas, cudaStream_t stream, std::string* msg) {
  DbMaps maps;
  int res = encode_kmajor(&maps.a, p.a, p.m, p.k);
  const char* which = "A";
  if (res == 0) {
    res = encode_kmajor(&maps.b, p.b, p.g * p.n, p.k);
    which = "B";
  }
  if (res != 0) {
    if (msg != nullptr) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "fp8_db tma stages=%d: cuTensorMapEncodeTiled of %s failed (%s %d)", NS, which,
                    res == -1 ? "entry point not found" : "CUresult", res);
      *msg = buf;
    }
    return static_cast<int>(cudaErrorInvalidValue);
  }
  int sms = 0;
  const int smem = DbLayout<NS>::bytes(p.g);
  cudaError_t err = opt_in<NS, 0, true>(&sms);
  if (err == cudaSuccess) {
    if (ctas <= 0) ctas = sms;
    fp8_db_tma_kernel<NS><<<ctas, kThreads, smem, stream>>>(p, maps);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess && msg != nullptr) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "fp8_db tma stages=%d smem=%d ctas=%d: %s", NS, smem, ctas,
                  cudaGetErrorString(err));
    *msg = buf;
  }
  return static_cast<int>(err);
}

}  // namespace

std::vector<std::tuple<int, int, int>> fp8_db_variants() {
  return {{4, 0, 0}, {5, 0, 0}, {5, 1, 0}, {4, 0, 1}, {5, 0, 1}};
}

int fp8_db_smem_bytes(int stages, int g) {
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
  if (m == 0) return 0;
  DbParams p{reinterpret_cast<const uint8_t*>(a), reinterpret_cast<const float*>(sfa),
             reinterpret_cast<const uint8_t*>(b), reinterpret_cast<const float*>(sfb),
             reinterpret_cast<const int*>(offs), reinterpret_cast<__nv_bfloat16_raw*>(out), m, n, k, g};
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (tma != 0) {
    if (stages == 4 && stagger == 0 && tma == 1) return launch_tma<4>(p, ctas, s, msg);
    if (stages == 5 && stagger == 0 && tma == 1) return launch_tma<5>(p, ctas, s, msg);
    return -1;
  }
  if (stages == 4 && stagger == 0) return launch<4>(p, ctas, s, msg);
  if (stages == 5 && stagger == 0) return launch<5>(p, ctas, s, msg);
  if (stages == 5 && stagger == 1) return launch<5, kStaggerNs>(p, ctas, s, msg);
  return -1;
}

}  // namespace dg_fp8db
