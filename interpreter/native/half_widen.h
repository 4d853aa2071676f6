// Exact float16 / bfloat16 -> float32 widening with integer vector operations, for the
// native kernels: the half-precision product (half_matvec.h) widens its x and weights, the
// quantized one (quantized_kernel.h) its float16 scales and biases.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "matvec_common.h"

namespace mlxgraph_native {

typedef uint16_t v8h_bits __attribute__((vector_size(16)));

// 8 float16 or bfloat16 values (their bits) as float32, exactly, without float16
// arithmetic (none on x86-64-v3) and without denormal float32 operands (slow on x86).
template <bool BF16>
__attribute__((always_inline)) inline v8f widen8(const uint16_t* p) {
  v8h_bits bits;
  std::memcpy(&bits, p, sizeof(bits));
  const v8u h = __builtin_convertvector(bits, v8u);
  v8u wide;
  if constexpr (BF16) {
    wide = h << 16;  // bfloat16 is float32's top half
  } else {
    const v8u mag = h & 0x7fffu;
    // Normal: exponent and mantissa moved to float32's places, the exponent rebiased.
    const v8u normal = (mag << 13) + (112u << 23);
    // Zero or subnormal (m * 2^-24): 0.5 + m * 2^-24 built exactly, then 0.5 taken off.
    v8f half_plus;
    const v8u bits_plus = mag | 0x3f000000u;
    std::memcpy(&half_plus, &bits_plus, sizeof(half_plus));
    half_plus -= 0.5f;
    v8u sub;
    std::memcpy(&sub, &half_plus, sizeof(sub));
    const v8u is_sub = (v8u)(mag < 0x0400u), is_special = (v8u)(mag >= 0x7c00u);
    wide = (normal & ~is_sub) | (sub & is_sub) | (is_special & 0x7f800000u) |
           ((h & 0x8000u) << 16);
  }
  v8f out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// n float16 (or bfloat16) values to float32 through widen8, the tail padded.
template <bool BF16>
__attribute__((always_inline)) inline void widen(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8f v = widen8<BF16>(src + i);
    std::memcpy(dst + i, &v, sizeof(v));
  }
  if (i < n) {
    uint16_t tail[8] = {};
    std::memcpy(tail, src + i, (n - i) * sizeof(uint16_t));
    const v8f v = widen8<BF16>(tail);
    std::memcpy(dst + i, &v, (n - i) * sizeof(float));
  }
}

}  // namespace mlxgraph_native
