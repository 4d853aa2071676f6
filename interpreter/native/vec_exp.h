// exp(-|x|) of 16 floats at a time in vector registers, shared by mlxgraph's native float32
// sigmoid/SiLU (activations.cpp) and attention softmax (attention_softmax.cpp).
//
// Why: the mlx[cpu] wheel for x86-64 computes exp one element at a time, with a library
// call per fused multiply-add (~16-20 M elements/s here). Method:
//   |x| = n ln2 + r, |r| <= ln2 / 2 (ln2 split in two parts so n ln2 is exact enough),
//   exp(-r) by its Taylor series to degree 7 (truncation < 0.2 ulp on that interval),
//   2^-n from the exponent bits (in two factors, so results down to the subnormals are right).
// The functions are always inlined, so each GCC target clone of a caller (MLXG_CLONES:
// AVX-512, AVX2, baseline) compiles them for its own instruction set.
#pragma once

#include <cstdint>

#include "vec_block.h"

namespace mlxgraph_exp {

constexpr float LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693145751953125f;       // ln2's leading bits: n * LN2_HI is exact
constexpr float LN2_LO = 1.42860676533018700e-06f; // ln2 - LN2_HI
// Past this, exp(-|x|) and |x| exp(-|x|) both round to 0 in float32 (below 2^-150).
constexpr float MAX_ARG = 112.0f;

// 2^-m for 0 <= m <= 126, from the exponent bits (a normal float; m <= 81 here).
inline __attribute__((always_inline)) vf exp2_neg(vi m) { return (vf)((127 - m) << 23); }

// exp(-(a + lo)) for a >= 0 as the product pn * tail of two factors (pn normal, tail a
// power of two): multiplying by pn first, then by tail, rounds once into the subnormal range
// where the result lies there. `lo` is the rounding error of a difference that made `a`
// (|lo| <= ulp(a) / 2; 0 for an exact a): it enters the reduced argument, so a large a
// loses none of its accuracy to that rounding. tail is 0 past MAX_ARG, for a = +inf and
// for NaN (callers that must keep NaN restore it).
struct ExpParts {
  vf pn, tail;
};

inline __attribute__((always_inline)) ExpParts exp_neg(vf a, vf lo = vf{}) {
  vi inside = a < MAX_ARG;
  a = inside ? a : splat(MAX_ARG);
  lo = inside ? lo : vf{};
  vi n = __builtin_convertvector(a * LOG2E + 0.5f, vi);  // round(a / ln2), a >= 0
  vf nf = __builtin_convertvector(n, vf);
  vf r = (a - nf * LN2_HI) + (lo - nf * LN2_LO);  // a + lo = n ln2 + r
  // exp(-r) = sum (-r)^k / k!, Horner from degree 7
  vf p = splat(-1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r - 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r - 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r - 1.0f;
  p = p * r + 1.0f;
  vi n1 = n >> 1;                               // n = n1 + (n - n1), each factor normal
  vf tail = exp2_neg(n - n1);
  return {p * exp2_neg(n1), inside ? tail : vf{}};
}

}  // namespace mlxgraph_exp
