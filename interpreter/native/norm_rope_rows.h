// The row kernels of mlxgraph's float32 RMSNorm and RoPE (norm_rope.cpp: the MLX side), one
// entry point per instruction-set level (tests and benchmarks pick one). One translation
// unit includes it.
//
// Rounding: RoPE rounds each product to float32, then their sum, exactly as MLX's own ops
// (bitwise equal to them). RMSNorm sums the squares in float64 (each square exact there) and
// rounds x * rsqrt(mean + eps) to float32 before the weight's product, as Hugging Face's
// LlamaRMSNorm and the MLX-op kernel do.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mlx/array.h"
#include "simd_name.h"
#include "vec_block.h"

namespace mlxgraph_norm {

using namespace mlxgraph_exp;

// The rows (all axes but the last) of a view with these strides.
struct Rows {
  mlx::core::Shape shape;
  mlx::core::Strides strides;

  // Each row's element offset, in row-major order (an odometer: no division per row).
  std::vector<int64_t> offsets() const {
    int64_t n = 1;
    const int outer = (int)shape.size() - 1;
    for (int k = 0; k < outer; ++k) n *= shape[k];
    std::vector<int64_t> out(n);
    std::vector<int> idx(outer, 0);
    int64_t off = 0;
    for (int64_t r = 0; r < n; ++r) {
      out[r] = off;
      for (int k = outer - 1; k >= 0; --k) {
        off += strides[k];
        if (++idx[k] < shape[k]) break;
        off -= strides[k] * shape[k];
        idx[k] = 0;
      }
    }
    return out;
  }
  // The row at this offset, or its elements gathered into buf when the last axis is strided.
  const float* row(const float* base, int64_t off, std::vector<float>& buf) const {
    const float* p = base + off;
    const int64_t step = strides.back();
    if (step == 1) return p;
    buf.resize(shape.back());
    for (int j = 0; j < shape.back(); ++j) buf[j] = p[j * step];
    return buf.data();
  }
};

struct RmsJob {
  const float* x;
  const float* w;  // null: no weight
  float* y;        // row-contiguous, x's shape
  Rows rows;
  float eps;
};

struct RopeJob {
  const float *x, *c, *s;
  float* y;         // row-contiguous, the broadcast shape
  Rows xr, cr, sr;  // the broadcast shape, each operand's strides
};

// No fused multiply-add: RoPE must round its products as MLX's separate ops do (GCC's C++
// default contracts a * b - c * d into one FMA).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

#define MLXG_INLINE inline __attribute__((always_inline))
typedef double vd __attribute__((vector_size(8 * VL)));

template <bool FULL>
MLXG_INLINE void add_squares(const float* x, int n, vd& acc) {
  vd v = __builtin_convertvector(load<FULL>(x, n), vd);
  acc += v * v;  // a float32 square is exact in float64
}

template <bool FULL, bool WEIGHT>
MLXG_INLINE void scale_block(const float* x, const float* w, float* y, int n, vf r) {
  vf v = load<FULL>(x, n) * r;  // rounded to float32 before the weight's product
  if (WEIGHT) v = v * load<FULL>(w, n);
  store<FULL>(y, v, n);
}

template <bool WEIGHT>
MLXG_INLINE void rms_row(const float* x, const float* w, float* y, int d, float eps) {
  const int full = d - d % VL;
  vd acc{};
  for (int j = 0; j < full; j += VL) add_squares<true>(x + j, VL, acc);
  if (full < d) add_squares<false>(x + full, d - full, acc);
  double sum = 0.0;
  for (int l = 0; l < VL; ++l) sum += acc[l];
  // A float32 sum (torch's, MLX's) overflows here: rsqrt(inf) = 0, and inf * 0 = NaN.
  if (sum > FLT_MAX) sum = std::numeric_limits<double>::infinity();
  const vf r = splat((float)(1.0 / std::sqrt(sum / d + (double)eps)));
  for (int j = 0; j < full; j += VL) scale_block<true, WEIGHT>(x + j, w + j, y + j, VL, r);
  if (full < d) scale_block<false, WEIGHT>(x + full, w + full, y + full, d - full, r);
}

// One block of both halves: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2, each product rounded.
template <bool FULL>
MLXG_INLINE void rope_block(const float* x, const float* c, const float* s, float* y, int half,
                            int n) {
  const vf x1 = load<FULL>(x, n), x2 = load<FULL>(x + half, n);
  const vf a = x1 * load<FULL>(c, n), b = x2 * load<FULL>(s, n);
  store<FULL>(y, a - b, n);
  const vf e = x2 * load<FULL>(c + half, n), f = x1 * load<FULL>(s + half, n);
  store<FULL>(y + half, e + f, n);
}

MLXG_INLINE void rms_rows(const RmsJob& j) {
  thread_local std::vector<float> buf;
  const int d = j.rows.shape.back();
  const auto offsets = j.rows.offsets();
  for (size_t r = 0; r < offsets.size(); ++r) {
    const float* x = j.rows.row(j.x, offsets[r], buf);
    if (j.w) rms_row<true>(x, j.w, j.y + r * d, d, j.eps);
    else rms_row<false>(x, nullptr, j.y + r * d, d, j.eps);
  }
}

MLXG_INLINE void rope_rows(const RopeJob& j) {
  thread_local std::vector<float> bx, bc, bs;
  const int d = j.xr.shape.back(), half = d / 2, full = half - half % VL;
  const auto xo = j.xr.offsets(), co = j.cr.offsets(), so = j.sr.offsets();
  for (size_t r = 0; r < xo.size(); ++r) {
    const float *x = j.xr.row(j.x, xo[r], bx), *c = j.cr.row(j.c, co[r], bc),
                *s = j.sr.row(j.s, so[r], bs);
    float* y = j.y + r * d;
    for (int k = 0; k < full; k += VL) rope_block<true>(x + k, c + k, s + k, y + k, half, VL);
    if (full < half)
      rope_block<false>(x + full, c + full, s + full, y + full, half, half - full);
  }
}

// One entry point per instruction set; the always-inlined code above compiles for each.
inline void rms_generic(const RmsJob& j) { rms_rows(j); }
inline void rope_generic(const RopeJob& j) { rope_rows(j); }
#if defined(__x86_64__)
MLXG_AVX512 inline void rms_avx512(const RmsJob& j) { rms_rows(j); }
MLXG_AVX512 inline void rope_avx512(const RopeJob& j) { rope_rows(j); }
MLXG_AVX2 inline void rms_avx2(const RmsJob& j) { rms_rows(j); }
MLXG_AVX2 inline void rope_avx2(const RopeJob& j) { rope_rows(j); }
#endif

#pragma GCC pop_options

struct Level {
  const char* name;
  void (*rms)(const RmsJob&);
  void (*rope)(const RopeJob&);
};

// The levels this CPU runs, best first.
inline const std::vector<Level>& all_levels() {
  static const std::vector<Level> all = [] {
    std::vector<Level> out;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) out.push_back({"avx512", rms_avx512, rope_avx512});
    if (__builtin_cpu_supports("x86-64-v3")) out.push_back({"avx2", rms_avx2, rope_avx2});
#endif
    out.push_back({"generic", rms_generic, rope_generic});
    return out;
  }();
  return all;
}

}  // namespace mlxgraph_norm
