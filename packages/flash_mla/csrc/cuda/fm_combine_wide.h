// Host side of fm_combine_wide.cu (included by .cu files only: it needs the CUDA runtime types).
#pragma once
#include <cuda_runtime.h>

#include "fm_sparse_decode.h"

namespace fm {

// Launches combine_wide_kernel with cfg (grid, block, stream and the PDL attribute set by the caller, as for
// combine_kernel) on a's partials; returns a cudaError_t code.
int launch_combine_wide(const LaunchArgs& a, cudaLaunchConfig_t* cfg);

}  // namespace fm
