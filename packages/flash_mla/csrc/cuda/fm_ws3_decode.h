// Host interface of fm_ws3_decode.cu, the ws3 variant of the warp-specialised sparse MLA kernel (no CUDA or torch
// headers: the pybind11 side includes it). Same fm_ws::LaunchArgs as ws / ws2, except that Params::tiles_per_split
// counts 64-row tiles (fm_ws3_block_rows()).
#pragma once
#include <stdint.h>

#include "fm_ws_decode.h"

// Returns a cudaError_t code (0 = success). mode: 0 = the kernel, 1 = producer only, 2 = consumers only (timing-only
// ablations, as fm_ws_launch's modes 1 and 2).
int fm_ws3_launch(const fm_ws::LaunchArgs& a, bool fp8, int mode, uintptr_t stream);
int fm_ws3_smem_bytes(bool fp8);
int fm_ws3_block_rows();  // KV rows per tile (the unit of tiles_per_split): 64
int fm_ws3_threads(bool fp8);  // threads per CTA: 384 (BF16: one producer warpgroup) / 512 (FP8: two)
