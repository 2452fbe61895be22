// e2m1 and E8M0 decoding of the W4A16 dequantiser (w4a16_dq_kernel.cuh), host + device so that the CPU tests
// (tests/test_dg_w4a16_dq.py) compile and check these exact functions with g++ against every code and scale byte.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DG_DQ_HD __host__ __device__ __forceinline__
#else
#define DG_DQ_HD inline
#endif

namespace dg::w4a16_dq {

DG_DQ_HD float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

DG_DQ_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

// float -> bf16 bits, round to nearest even (NaN stays a quiet NaN); the same code on host and device, so the CPU
// test covers the kernel's rounding too.
DG_DQ_HD uint32_t float_to_bf16_bits(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// e2m1 code (low 4 bits of c) as a float: sign s, exponent field e, mantissa bit b -> e == 0: b * 0.5; else
// (1 + b / 2) * 2^(e - 1). No table: a dynamically indexed array would live in local memory.
DG_DQ_HD float e2m1_to_float(uint32_t c) {
  uint32_t e = (c >> 1) & 3u, b = c & 1u;
  uint32_t mag = e == 0 ? (b ? 0x3F000000u : 0u) : (((126u + e) << 23) | (b << 22));
  return bits_to_float(mag | ((c & 8u) << 28));
}

// 2^(byte - 127) as a float: byte 0 is the subnormal 2^-127, 255 is NaN (E8M0's NaN).
DG_DQ_HD float e8m0_to_float(uint32_t s) {
  uint32_t bits = s == 0 ? 0x00400000u : (s == 255 ? 0x7FC00000u : (s << 23));
  return bits_to_float(bits);
}

// One scale group: 16 packed bytes (as 4 little-endian words: byte j holds elements 2j (low nibble) and 2j+1) and
// its E8M0 byte -> 32 bf16 in k order, two a word (element 2j in the low half of out[j]).
DG_DQ_HD void dequant_group32(const uint32_t words[4], uint32_t scale_byte, uint32_t out[16]) {
  float scale = e8m0_to_float(scale_byte);
  for (int q = 0; q < 4; ++q) {
    for (int b = 0; b < 4; ++b) {
      uint32_t byte = (words[q] >> (8 * b)) & 0xFFu;
      uint32_t lo = float_to_bf16_bits(e2m1_to_float(byte) * scale);
      uint32_t hi = float_to_bf16_bits(e2m1_to_float(byte >> 4) * scale);
      out[4 * q + b] = lo | (hi << 16);
    }
  }
}

}  // namespace dg::w4a16_dq
