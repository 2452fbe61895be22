// Host-side launch helper shared by the hand-written sm_90a kernels' launchers (dg_w4a8_ws.cu, dg_w4a8_rs.cu,
// dg_w4a8_rs_ablate.cu, dg_fp8_db.cu). Host code only: the kernels' machine code does not depend on it.
#pragma once
#include <cuda_runtime.h>

namespace dg_launch {

constexpr int kMaxDevices = 64;

// Opts `Kernel` in to `smem_max` bytes of dynamic shared memory (the largest any launch of it needs) once per device,
// so a later launch under CUDA-graph capture makes no attribute call, and returns the device's SM count in *sms.
// One state per kernel: the kernel's address is the template argument.
template <auto Kernel>
cudaError_t opt_in_smem_once(int smem_max, int* sms) {
  static bool configured[kMaxDevices] = {};
  static int n_sms[kMaxDevices] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (!configured[dev]) {
    err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&n_sms[dev], cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    configured[dev] = true;
  }
  *sms = n_sms[dev];
  return cudaSuccess;
}

}  // namespace dg_launch
