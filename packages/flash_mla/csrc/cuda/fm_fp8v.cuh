// FP8 (V4 584-byte rows) -> bf16 helpers shared by the lane-uniform FP8 producers: ws3p's kOptVec (fm_ws3_decode.cu,
// fp8v_tile) and the serial kernel's fp8v path (fm_sparse_decode.cu, vec_load / vec_store). Moved here in session 9
// from fm_ws3_decode.cu unchanged (that file's SASS is the same: checked with cuobjdump), so both kernels convert with
// the same instructions. Row format: 448 e4m3 bytes (7 x 64 dims), 128 bytes of bf16 RoPE (dims 448..511), 8 scale
// bytes (576 + k: 2^(byte - 127) for dims 64 k .. 64 k + 63; byte 255 = NaN); rows are only 8-byte aligned.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace fm_fp8v {

// dequant8's scale byte sb as the bf16x2 multiplier of dequant8v (kOptVec): 2^(sb - 127) in both halves (sb 0: +0,
// as dequant8's 0.0f; sb 255: bf16 NaN 0x7fc0, as dequant8's 0x7fc00000 rounded).
__device__ __forceinline__ uint32_t bf16x2_scale(uint32_t sb) { return sb == 255u ? 0x7fc07fc0u : (sb << 7) * 0x10001u; }

// One row of a lane's unit: 8 bytes at p (first), 8 at p2 (second) and the scale byte at ps, all predicated on
// row >= 0 (a hole: zeros) in one block (one predicate: fewer instructions than three separate predicated loads).
__device__ __forceinline__ void ldg_unit_if(const uint8_t* p, const uint8_t* p2, const uint8_t* ps, int row, uint2& lo,
                                            uint2& hi, uint32_t& sb) {
  asm volatile(
      "{\n.reg .pred q;\nsetp.ge.s32 q, %8, 0;\nmov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
      "mov.b32 %4, 0;\n@q ld.global.nc.v2.u32 {%0, %1}, [%5];\n@q ld.global.nc.v2.u32 {%2, %3}, [%6];\n"
      "@q ld.global.nc.u8 %4, [%7];\n}\n"
      : "=r"(lo.x), "=r"(lo.y), "=r"(hi.x), "=r"(hi.y), "=r"(sb)
      : "l"(p), "l"(p2), "l"(ps), "r"(row));
}

__device__ __forceinline__ void sts128(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// 8 e4m3 bytes times the bf16x2 multiplier m2 = bf16x2_scale(sb) -> 8 bf16, bit-identical to dequant8(b, 2^(sb-127)):
// e4m3 -> f16 -> f32 -> bf16 is exact (every e4m3 value and NaN is a bf16 number; NaN becomes the canonical NaN),
// then ONE rounding of the exact product e4m3 * 2^(sb - 127) by the bf16x2 multiply (no flush of bf16 subnormals,
// signed zeros and NaN as dequant8's fp32 multiply and cvt: session 7's dequant8c argument and GPU test; the CPU
// emulation is tests/test_mla_fp8v.py::test_dequant8v_emulation_equals_dequant8). 5 instructions per pair (dequant8: 6
// and a shift per word: the high pair's cvt reads the register's upper half here, F2FP ... R.H1).
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}
__device__ __forceinline__ uint4 dequant8v(uint2 b, uint32_t m2) {
  const uint32_t w[2] = {b.x, b.y};
  const __nv_bfloat162 m = *reinterpret_cast<const __nv_bfloat162*>(&m2);
  uint32_t o[4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t hp[2];
    e4m3x4_to_f16x2x2(w[h], hp[0], hp[1]);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hp[k]));
      const __nv_bfloat162 x = __floats2bfloat162_rn(f.x, f.y);  // exact
      const __nv_bfloat162 r = __hmul2(x, m);
      o[2 * h + k] = *reinterpret_cast<const uint32_t*>(&r);
    }
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

}  // namespace fm_fp8v
