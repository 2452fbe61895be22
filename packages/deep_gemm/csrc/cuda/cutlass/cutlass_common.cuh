// Host helpers shared by the CUTLASS GEMM templates (fp8_gemm_kernel.cuh, fp8_grouped_kernel.cuh,
// w4a16_dq_kernel.cuh): the cached SM count, 256-byte carving of one device buffer into per-group arrays, the grouped
// scheduler / epilogue settings, and errors that name the GEMM and the failing step.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>

#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"

namespace dg::cutlass_common {

// SM count per device, queried once (CUTLASS would query it on every call otherwise); 0 when there is no device.
inline int sm_count() {
  static int cached[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  if (cached[dev] == 0) {
    cached[dev] = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(dev);
  }
  return cached[dev];
}

// The device's hardware info for a grouped GEMM's arguments; throws "<who>: no CUDA device" without one.
inline cutlass::KernelHardwareInfo hw_info(const char* who) {
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = sm_count();
  if (hw.sm_count <= 0) throw std::runtime_error(std::string(who) + ": no CUDA device");
  return hw;
}

inline size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

// The next g-element array of T from p (256-byte aligned pieces); p advances past it.
template <class T>
T* carve(char*& p, int g) {
  T* out = reinterpret_cast<T*>(p);
  p += align_up(sizeof(T) * static_cast<size_t>(g));
  return out;
}

// D = A @ B (alpha 1, no C) and the grouped tile scheduler: raster 2 = along N, else along M (CUTLASS's grouped
// default; 0, the heuristic, means along M here); swizzle = max_swizzle_size.
template <class Arguments>
void set_grouped_epilogue_and_scheduler(Arguments& args, int raster, int swizzle) {
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.scheduler.max_swizzle_size = swizzle;
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = raster == 2 ? Raster::AlongN : Raster::AlongM;
}

// Throw "<who>: <what> failed (<status>)" unless st is kSuccess.
inline void check_status(cutlass::Status st, const char* who, const char* what) {
  if (st != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string(who) + ": " + what + " failed (" + cutlassGetStatusString(st) + ")");
  }
}

// Throw "<who> <what>: <CUDA error>" unless err is cudaSuccess.
inline void check_cuda(cudaError_t err, const char* who, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(who) + " " + what + ": " + cudaGetErrorString(err));
}

}  // namespace dg::cutlass_common
