// x rounded to int8 for the int8 kernel (int8_kernel.h), one row at a time, in GCC's generic
// vectors that each instruction-set level compiles with its own target (int8_levels()):
// per block of 32 values the scale d = max|x| / 127 and q = rint(x / d), the same values,
// bit for bit, as the scalar loop this replaced (a libm rint and a scalar division per
// value, on one thread before each product: ~0.4 ms of the small Llama's q8 decode step of
// ~9, ~0.8 ms of q4's ~6).
#pragma once

#include <cstdint>
#include <cstring>

#include "int8_ops.h"

namespace mlxgraph_native {

typedef int8_t v16c __attribute__((vector_size(16)));
typedef int8_t v8c __attribute__((vector_size(8)));
typedef int64_t v8l __attribute__((vector_size(64)));

// Weights per chunk at ``bits``.
constexpr int weights_per_chunk(int bits) { return CHUNK * 8 / bits; }

// rint(v) for |v| < 2^22 in the default rounding mode: v + 1.5 * 2^23 lies in [2^23, 2^24),
// where floats are the integers, so the addition rounds v to an integer as rint does (ties
// to even: the constant is even); the subtraction is exact. (No -ffast-math here: GCC
// keeps both operations.)
inline v16f rint_small(v16f v) {
  const v16f magic = v16f{} + 12582912.0f;
  return (v + magic) - magic;
}

// One block of 32 values: its int8 values (lo: the first 16, hi: the next 16) and scale.
// False for a block holding an infinity or a NaN (then zeros): max|x| is taken on the bits
// of |x|, which order finite floats as their values and put infinities and NaNs above.
inline bool quantize_block(const float* x, v16i& lo, v16i& hi, float& scale) {
  v16f a, b;
  std::memcpy(&a, x, sizeof(a));
  std::memcpy(&b, x + 16, sizeof(b));
  v16u ua, ub;
  std::memcpy(&ua, &a, sizeof(ua));
  std::memcpy(&ub, &b, sizeof(ub));
  ua &= 0x7fffffffu;
  ub &= 0x7fffffffu;
  const v16u both = ua > ub ? ua : ub;
  uint32_t bits = 0;
  for (int j = 0; j < LANES16; ++j) bits = bits > both[j] ? bits : both[j];
  lo = hi = v16i{};
  scale = 0;
  if (bits >= 0x7f800000u) return false;
  float amax;
  std::memcpy(&amax, &bits, sizeof(amax));
  scale = amax / 127.0f;
  if (!(scale > 0)) return true;   // zeros (or below the smallest scale): q = 0
  const v16f d = v16f{} + scale, top = v16f{} + 127.0f, bottom = v16f{} - 127.0f;
  v16f qa = rint_small(a / d), qb = rint_small(b / d);   // |x / d| <= 127 and a rounding
  qa = qa > top ? top : qa;
  qa = qa < bottom ? bottom : qa;
  qb = qb > top ? top : qb;
  qb = qb < bottom ? bottom : qb;
  lo = __builtin_convertvector(qa, v16i);
  hi = __builtin_convertvector(qb, v16i);
  return true;
}

inline void store16(int8_t* out, v16i v) {
  const v16c c = __builtin_convertvector(v, v16c);
  std::memcpy(out, &c, sizeof(c));
}

// The low bytes of 8 int64 lanes: a pair of int32 values as one lane, the even value in its
// low half, the odd one in its high half on a little-endian CPU (x86-64, arm64); GCC 12
// scalarizes the two-vector shuffle that would say it directly.
inline void store8(int8_t* out, v8l v) {
  const v8c c = __builtin_convertvector(v, v8c);
  std::memcpy(out, &c, sizeof(c));
}

// Row x of length k as the kernel's chunks meet it: xq [chunks][weights per chunk] (at 4
// bits per chunk its 64 even values, then its 64 odd ones), xd [chunks][16] each lane's
// scale, xsum [k / group_size] the per-group float32 sums (summed in order, as the exact
// kernel's). A partial last chunk's padding is zero. False when x holds an infinity or a NaN.
template <int BITS>
inline bool prepare_row(const float* x, int k, int group_size, int8_t* xq, float* xd,
                        float* xsum) {
  constexpr int WPC = weights_per_chunk(BITS), BPC = WPC / XBLOCK, LPB = LANES16 / BPC;
  const int chunks = (k + WPC - 1) / WPC;
  std::memset(xq + (size_t)(chunks - 1) * WPC, 0, WPC);
  std::memset(xd + (size_t)(chunks - 1) * LANES16, 0, LANES16 * sizeof(float));
  bool finite = true;
  float total = 0;
  for (int blk = 0; blk < k / XBLOCK; ++blk) {
    const float* xb = x + blk * XBLOCK;
    v16i lo, hi;
    float scale;
    finite &= quantize_block(xb, lo, hi, scale);
    int8_t* out = xq + (size_t)(blk / BPC) * WPC;
    const int b = blk % BPC;
    if constexpr (BITS == 8) {
      store16(out + XBLOCK * b, lo);
      store16(out + XBLOCK * b + 16, hi);
    } else {
      v8l pairs[2];
      std::memcpy(&pairs[0], &lo, sizeof(lo));
      std::memcpy(&pairs[1], &hi, sizeof(hi));
      for (int h = 0; h < 2; ++h) {
        store8(out + 16 * b + 8 * h, pairs[h]);
        store8(out + WPC / 2 + 16 * b + 8 * h, pairs[h] >> 32);
      }
    }
    float* lanes = xd + (size_t)(blk / BPC) * LANES16 + b * LPB;
    for (int j = 0; j < LPB; ++j) lanes[j] = scale;
    for (int i = 0; i < XBLOCK; ++i) total += xb[i];
    if ((blk + 1) * XBLOCK % group_size == 0) {
      xsum[(blk + 1) * XBLOCK / group_size - 1] = total;
      total = 0;
    }
  }
  return finite;
}

// prepare_row for ``bits``, per instruction set (its target given by the entry point).
using Int8PrepareFn = bool (*)(const float*, int, int, int, int8_t*, float*, float*);

inline bool prepare_row_bits(const float* x, int k, int group_size, int bits, int8_t* xq,
                             float* xd, float* xsum) {
  return bits == 8 ? prepare_row<8>(x, k, group_size, xq, xd, xsum)
                   : prepare_row<4>(x, k, group_size, xq, xd, xsum);
}

__attribute__((flatten)) inline bool prepare_row_generic(const float* x, int k, int group_size,
                                                         int bits, int8_t* xq, float* xd,
                                                         float* xsum) {
  return prepare_row_bits(x, k, group_size, bits, xq, xd, xsum);
}
#if defined(__x86_64__)
__attribute__((flatten)) MLXG_AVX512_VNNI inline bool prepare_row_vnni(
    const float* x, int k, int group_size, int bits, int8_t* xq, float* xd, float* xsum) {
  return prepare_row_bits(x, k, group_size, bits, xq, xd, xsum);
}
__attribute__((flatten)) MLXG_AVX2 inline bool prepare_row_avx2(
    const float* x, int k, int group_size, int bits, int8_t* xq, float* xd, float* xsum) {
  return prepare_row_bits(x, k, group_size, bits, xq, xd, xsum);
}
#endif

}  // namespace mlxgraph_native
