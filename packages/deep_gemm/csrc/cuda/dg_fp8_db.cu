// Launchers of the FP8 block-scaled grouped GEMM with double-buffered promotion (kernel and numerics: dg_fp8_db.cuh).
#include "dg_fp8_db.h"

#include <cstdio>

#include "dg_fp8_db.cuh"

namespace dg_fp8db {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kStaggerNs = 1000;  // ~2 k blocks of one CTA at full rate (stagger = 1)

// Opt in to the largest shared memory any g <= kMaxGroups needs, once per device and stage count (a launch under
// CUDA-graph capture then only launches); returns the SM count.
template <int NS, int STAGGER>
cudaError_t opt_in(int* sms) {
  static bool configured[kMaxDevices] = {};
  static int n_sms[kMaxDevices] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (!configured[dev]) {
    err = cudaFuncSetAttribute(fp8_db_kernel<NS, STAGGER>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               DbLayout<NS>::bytes(kMaxGroups));
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&n_sms[dev], cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    configured[dev] = true;
  }
  *sms = n_sms[dev];
  return cudaSuccess;
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

}  // namespace

std::vector<std::pair<int, int>> fp8_db_variants() { return {{4, 0}, {5, 0}, {5, 1}}; }

int fp8_db_smem_bytes(int stages, int g) {
  if (stages == 4) return DbLayout<4>::bytes(g);
  if (stages == 5) return DbLayout<5>::bytes(g);
  return -1;
}

int fp8_db_launch(int stages, int stagger, std::uintptr_t a, std::uintptr_t sfa, std::uintptr_t b,
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
  if (stages == 4 && stagger == 0) return launch<4>(p, ctas, s, msg);
  if (stages == 5 && stagger == 0) return launch<5>(p, ctas, s, msg);
  if (stages == 5 && stagger == 1) return launch<5, kStaggerNs>(p, ctas, s, msg);
  return -1;
}

}  // namespace dg_fp8db
