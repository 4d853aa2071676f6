// The arithmetic of mlxgraph's quantized matrix-vector product (quantized_matvec.cpp wraps
// it in an MLX primitive; docs/architecture.md#quantized-weights):
//
//   y[m, n] = sum_g scales[n, g] * dot(codes[n, g, :], x[m, g, :]) + biases[n, g] * xsum[m, g]
//
// for M <= MAX_ROWS float32 rows of x [M, K] and W [N, K] in MLX's packed layout (uint32
// words of 32 / bits codes, the first in the lowest bits: on a little-endian CPU, bytes in
// K order, at 4 bits the low nibble first), float32 or float16 scales and biases.
//
// Written to keep up with memory: W is read in 16-byte blocks (16 codes at 8 bits, 32 at 4
// bits), each widened to 16 int32 lanes and converted to float in registers, then one FMA
// per 16 weights against x. At 8 bits a block meets 16 consecutive x values. At 4 bits a
// byte holds an even code e (low nibble) and the next, odd one o, and e * x_e + o * x_o =
// e * (x_e - x_o / 16) + byte * (x_o / 16): the low nibbles and the whole bytes (one
// conversion each, no shift) meet x stored once per call as, per 32 values, the 16
// x_e - x_o / 16 then the 16 x_o / 16 (x_o / 16 is exact; the difference rounds once, an
// error of at most 15 * 2^-24 * (|x_e| + |x_o| / 16) per byte: float32 rounding). Four rows of W
// share each load of x, each group's scale multiplies a vector of partial sums, the bias
// terms are vector products with the per-group sums of x, and a row ends in one horizontal
// sum. Sums are float32, like MLX's own op.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "half_widen.h"
#include "matvec_common.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "codes are read as bytes");

namespace mlxgraph_native {

constexpr int BLOCK = 16;  // bytes of codes per step
constexpr int TILE = 4;    // rows of W per tile (and the unit of a thread's rows)
// Each row of a tile prefetches the same place of the row a tile below: a tile reads its
// rows (one contiguous stretch) as 4 interleaved streams, each too short for the hardware
// prefetcher to ramp up; prefetching a tile ahead made products from memory 15-30% faster
// than none or a fixed 512 bytes ahead.

struct QuantizedProblem {
  const float* x;        // [M][K], contiguous
  const uint8_t* w;      // [N][K * bits / 8]
  const void* scales;    // [N][G], float32 or float16 (half_scales)
  const void* biases;
  float* y;              // [M][N]
  int m, n, k, bits, group_size;
  bool half_scales;
  const float* xs = nullptr;    // x as the blocks meet it (prepare_x)
  const float* xsum = nullptr;  // [M][G], per-group sums of x
};

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint8_t v16b __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));

// The kernel's operations on 16 float lanes, per instruction set: one zmm (AVX-512), two
// ymm (AVX2), or GCC's generic vectors (baseline x86-64, NEON). Each entry point carries
// its target and ``flatten``, which inlines these into it: GCC refuses to inline an
// intrinsic into a function of another target, and target clones cannot hold one.
struct GenericOps {
  using F = v16f;
  static F zero() { return F{}; }
  static F load(const float* p) {
    F v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  // A 16-byte block of codes as floats: 8 bits: lo, the 16 codes; 4 bits: lo, the 16 low
  // nibbles, and hi, the 16 whole bytes.
  template <int BITS>
  static void codes(const uint8_t* p, F& lo, F& hi) {
    v16b bytes;
    std::memcpy(&bytes, p, sizeof(bytes));
    // Through 16 bits: GCC 12 scalarizes a direct 8 -> 32 bit conversion.
    const v16u c = __builtin_convertvector(__builtin_convertvector(bytes, v16h), v16u);
    if constexpr (BITS == 8) {
      lo = __builtin_convertvector(c, F);
    } else {
      lo = __builtin_convertvector(c & 15, F);
      hi = __builtin_convertvector(c, F);
    }
  }
  static F fma(F a, F b, F c) { return a * b + c; }
  static F scale(float s, F a, F c) { return s * a + c; }
  static void widen_half(const uint16_t* src, float* dst, size_t n) { widen<false>(src, dst, n); }
  static float sum(F v) {
    v8f h8[2];
    std::memcpy(h8, &v, sizeof(v));
    const v8f a = h8[0] + h8[1];
    v4f h4[2];
    std::memcpy(h4, &a, sizeof(a));
    const v4f b = h4[0] + h4[1];
    return (b[0] + b[2]) + (b[1] + b[3]);
  }
};

#if defined(__x86_64__)
struct Avx512Ops {
  using F = __m512;
  MLXG_AVX512 static F zero() { return _mm512_setzero_ps(); }
  MLXG_AVX512 static F load(const float* p) { return _mm512_loadu_ps(p); }
  template <int BITS>
  MLXG_AVX512 static void codes(const uint8_t* p, F& lo, F& hi) {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
    if constexpr (BITS == 8) {
      lo = _mm512_cvtepi32_ps(c);
    } else {
      // The low nibble as a float in one step: a permute reads the low 4 bits of each lane.
      const __m512 nibbles = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      lo = _mm512_permutexvar_ps(c, nibbles);
      hi = _mm512_cvtepi32_ps(c);
    }
  }
  MLXG_AVX512 static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  // float16 scales and biases: F16C's conversion (exact, subnormals and non-finite values
  // included), 16 per instruction; the integer widening of half_widen.h costs ~15 per 8.
  MLXG_AVX512 static void widen_half(const uint16_t* src, float* dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
    if (i < n) {
      const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
      const __m256i half = _mm256_maskz_loadu_epi16(tail, src + i);
      _mm512_mask_storeu_ps(dst + i, tail, _mm512_cvtph_ps(half));
    }
  }
  MLXG_AVX512 static F scale(float s, F a, F c) {
    return _mm512_fmadd_ps(_mm512_set1_ps(s), a, c);
  }
  MLXG_AVX512 static float sum(F v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    return (b[0] + b[2]) + (b[1] + b[3]);
  }
};

struct Avx2Ops {
  struct F {
    __m256 a, b;
  };
  MLXG_AVX2 static F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  MLXG_AVX2 static F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  template <int BITS>
  MLXG_AVX2 static void codes(const uint8_t* p, F& lo, F& hi) {
    const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
    const __m256i c1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));
    if constexpr (BITS == 8) {
      lo = {_mm256_cvtepi32_ps(c0), _mm256_cvtepi32_ps(c1)};
    } else {
      const __m256i mask = _mm256_set1_epi32(15);
      lo = {_mm256_cvtepi32_ps(_mm256_and_si256(c0, mask)),
            _mm256_cvtepi32_ps(_mm256_and_si256(c1, mask))};
      hi = {_mm256_cvtepi32_ps(c0), _mm256_cvtepi32_ps(c1)};
    }
  }
  MLXG_AVX2 static void widen_half(const uint16_t* src, float* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
    if (i < n) {
      uint16_t half[8] = {};
      float wide[8];
      std::memcpy(half, src + i, (n - i) * sizeof(uint16_t));
      _mm256_storeu_ps(wide, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)half)));
      std::memcpy(dst + i, wide, (n - i) * sizeof(float));
    }
  }
  MLXG_AVX2 static F fma(F x, F y, F c) {
    return {_mm256_fmadd_ps(x.a, y.a, c.a), _mm256_fmadd_ps(x.b, y.b, c.b)};
  }
  MLXG_AVX2 static F scale(float s, F x, F c) {
    const __m256 v = _mm256_set1_ps(s);
    return {_mm256_fmadd_ps(v, x.a, c.a), _mm256_fmadd_ps(v, x.b, c.b)};
  }
  MLXG_AVX2 static float sum(F v) {
    const __m256 a = _mm256_add_ps(v.a, v.b);
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    return (b[0] + b[2]) + (b[1] + b[3]);
  }
};
#endif

// Rows [r0, r0 + R) of W against rows [m0, m0 + MB) of x. s and b: the float32 scales and
// biases of row r0, the next row's ``stride`` floats on.
template <class S, int BITS, int R, int MB>
inline void tile(const QuantizedProblem& p, int r0, int m0, const float* s, const float* b,
                 size_t stride) {
  using F = typename S::F;
  constexpr int XV = BITS == 8 ? 1 : 2;  // vectors of x per block
  const int groups = p.k / p.group_size;
  const int per_group = p.group_size * BITS / 8 / BLOCK;
  const size_t row_bytes = (size_t)p.k * BITS / 8;
  const uint8_t* w = p.w + (size_t)r0 * row_bytes;
  const float* xs = p.xs + (size_t)m0 * p.k;
  F acc[R][MB];
#pragma GCC unroll 16
  for (int i = 0; i < R * MB; ++i) acc[i / MB][i % MB] = S::zero();
  for (int g = 0, blk = 0; g < groups; ++g) {
    F part[R][MB];
#pragma GCC unroll 16
    for (int i = 0; i < R * MB; ++i) part[i / MB][i % MB] = S::zero();
    for (const int end = blk + per_group; blk < end; ++blk) {
      F xv[MB][XV];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m)
#pragma GCC unroll 2
        for (int v = 0; v < XV; ++v)
          xv[m][v] = S::load(xs + (size_t)m * p.k + (size_t)blk * BLOCK * XV + 16 * v);
      if ((blk & 3) == 0)  // per row, a cache line of the next tile's same row
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r)
          __builtin_prefetch(w + (r + TILE) * row_bytes + (size_t)blk * BLOCK);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        F c[2];
        S::template codes<BITS>(w + r * row_bytes + (size_t)blk * BLOCK, c[0], c[1]);
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m)
#pragma GCC unroll 2
          for (int v = 0; v < XV; ++v) part[r][m] = S::fma(c[v], xv[m][v], part[r][m]);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < R * MB; ++i)
      acc[i / MB][i % MB] = S::scale(s[i / MB * stride + g], part[i / MB][i % MB],
                                     acc[i / MB][i % MB]);
  }
  for (int r = 0; r < R; ++r) {
    const float* br = b + r * stride;
    for (int m = 0; m < MB; ++m) {
      const float* xsum = p.xsum + (size_t)(m0 + m) * groups;
      int g = 0;
      for (; g + 16 <= groups; g += 16)
        acc[r][m] = S::fma(S::load(br + g), S::load(xsum + g), acc[r][m]);
      float total = S::sum(acc[r][m]);
      for (; g < groups; ++g) total += br[g] * xsum[g];
      p.y[(size_t)(m0 + m) * p.n + r0 + r] = total;
    }
  }
}

// Rows [r0, r0 + R) of W against every row of x: blocks of up to 4 rows of x; the rows of
// W (a few KB) stay in L1 for the later blocks.
template <class S, int BITS, int R>
inline void tile_rows(const QuantizedProblem& p, int r0, const float* s, const float* b,
                      size_t stride) {
  int m0 = 0;
  for (; m0 + 4 <= p.m; m0 += 4)
    for (int r = 0; r < R; ++r)
      tile<S, BITS, 1, 4>(p, r0 + r, m0, s + r * stride, b + r * stride, stride);
  switch (p.m - m0) {
    case 1: tile<S, BITS, R, 1>(p, r0, m0, s, b, stride); break;
    case 2:
      if constexpr (R % 2 == 0) {
        for (int r = 0; r < R; r += 2)
          tile<S, BITS, 2, 2>(p, r0 + r, m0, s + r * stride, b + r * stride, stride);
      } else {
        tile<S, BITS, 1, 2>(p, r0, m0, s, b, stride);
      }
      break;
    case 3:
      for (int r = 0; r < R; ++r)
        tile<S, BITS, 1, 3>(p, r0 + r, m0, s + r * stride, b + r * stride, stride);
      break;
    default: break;
  }
}

// Rows [lo, hi) of W (lo a multiple of TILE) a tile at a time: fn(r0, rows, s, b, groups)
// with the tile's scales and biases as float32, float16 ones widened into a buffer of the
// calling thread. P: any problem with k, group_size, scales and biases (the int8 kernel's
// too).
template <class S, bool HALF_SCALES, class P, class Fn>
inline void tiles_with_scales(const P& p, int lo, int hi, Fn&& fn) {
  const size_t groups = p.k / p.group_size;
  thread_local std::vector<float> wide;
  if (HALF_SCALES && wide.size() < 2 * TILE * groups) wide.resize(2 * TILE * groups);
  for (int r0 = lo; r0 < hi; r0 += TILE) {
    const int rows = std::min(TILE, hi - r0);
    if constexpr (HALF_SCALES) {
      const size_t at = r0 * groups, count = rows * groups;
      S::widen_half(static_cast<const uint16_t*>(p.scales) + at, wide.data(), count);
      S::widen_half(static_cast<const uint16_t*>(p.biases) + at, wide.data() + count, count);
      fn(r0, rows, wide.data(), wide.data() + count, groups);
    } else {
      fn(r0, rows, static_cast<const float*>(p.scales) + r0 * groups,
         static_cast<const float*>(p.biases) + r0 * groups, groups);
    }
  }
}

// Rows [lo, hi) of W. One row of x at 8 bits (a decode step) reads W one row at a time:
// one stream of codes reads faster than a tile's 4 interleaved rows (the small Llama's q8
// products per step 14.1 -> 11.2 ms on one EPYC thread); at 4 bits the tile's shared loads
// of x pay more (8.3 ms a row at a time against 8.8).
template <class S, int BITS, bool HALF_SCALES>
inline void quantized_rows(const QuantizedProblem& p, int lo, int hi) {
  tiles_with_scales<S, HALF_SCALES>(
      p, lo, hi, [&p](int r0, int rows, const float* s, const float* b, size_t groups) {
        if (rows == TILE && !(BITS == 8 && p.m == 1)) {
          tile_rows<S, BITS, TILE>(p, r0, s, b, groups);
        } else {
          for (int r = 0; r < rows; ++r)
            tile_rows<S, BITS, 1>(p, r0 + r, s + r * groups, b + r * groups, groups);
        }
      });
}

// Every (bits, scale dtype) variant for one instruction set.
template <class S>
inline void rows_for(const QuantizedProblem& p, int lo, int hi) {
  if (p.bits == 4) {
    if (p.half_scales) quantized_rows<S, 4, true>(p, lo, hi);
    else quantized_rows<S, 4, false>(p, lo, hi);
  } else {
    if (p.half_scales) quantized_rows<S, 8, true>(p, lo, hi);
    else quantized_rows<S, 8, false>(p, lo, hi);
  }
}

using RowsFn = void (*)(const QuantizedProblem&, int, int);

// The entry points: AVX-512 and AVX2 on x86-64 CPUs that have them, the generic one for
// older x86-64 CPUs (SSE2) and aarch64 (NEON).
__attribute__((flatten)) inline void rows_generic(const QuantizedProblem& p, int lo, int hi) {
  rows_for<GenericOps>(p, lo, hi);
}
#if defined(__x86_64__)
__attribute__((flatten)) MLXG_AVX512 inline void rows_avx512(const QuantizedProblem& p, int lo,
                                                             int hi) {
  rows_for<Avx512Ops>(p, lo, hi);
}
__attribute__((flatten)) MLXG_AVX2 inline void rows_avx2(const QuantizedProblem& p, int lo,
                                                         int hi) {
  rows_for<Avx2Ops>(p, lo, hi);
}
#endif

// The entry points this CPU runs, best first (the levels simd_name() reports); tests and
// benchmarks may pick a lower one (set_level).
struct Level {
  const char* name;
  RowsFn rows;
};

inline const std::vector<Level>& levels() {
  static const std::vector<Level> all = [] {
    std::vector<Level> out;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) out.push_back({"avx512", rows_avx512});
    if (__builtin_cpu_supports("x86-64-v3")) out.push_back({"avx2", rows_avx2});
#endif
    out.push_back({"generic", rows_generic});
    return out;
  }();
  return all;
}

inline std::atomic<int> g_level{0};  // index into levels()

// x as the blocks meet it (4 bits: per 32 values the 16 x_e - x_o / 16, then the 16
// x_o / 16; 8 bits: x itself) and its per-group sums, into the caller's buffers.
inline void prepare_x(QuantizedProblem& p, std::vector<float>& xs, std::vector<float>& xsum) {
  const int groups = p.k / p.group_size;
  xsum.resize((size_t)p.m * groups);
  for (int m = 0; m < p.m; ++m) {
    const float* xm = p.x + (size_t)m * p.k;
    for (int g = 0; g < groups; ++g) {
      float total = 0;
      for (int t = 0; t < p.group_size; ++t) total += xm[g * p.group_size + t];
      xsum[(size_t)m * groups + g] = total;
    }
  }
  p.xsum = xsum.data();
  if (p.bits == 8) {
    p.xs = p.x;
    return;
  }
  xs.resize((size_t)p.m * p.k);
  for (size_t at = 0; at < xs.size(); at += 32)
    for (int i = 0; i < 16; ++i) {
      const float even = p.x[at + 2 * i], odd_16 = p.x[at + 2 * i + 1] * 0.0625f;
      xs[at + i] = even - odd_16;
      xs[at + 16 + i] = odd_16;
    }
  p.xs = xs.data();
}

// The whole product: x prepared, then the rows of W over the pool.
inline void quantized_product(QuantizedProblem& p) {
  if (p.m == 0 || p.n == 0) return;
  const RowsFn rows = levels()[g_level.load()].rows;
  thread_local std::vector<float> xs, xsum;
  prepare_x(p, xs, xsum);
  const QuantizedProblem& q = p;
  parallel_rows(p.n, (long)p.n * p.k, [&q, rows](int lo, int hi) { rows(q, lo, hi); }, TILE);
}

}  // namespace mlxgraph_native
