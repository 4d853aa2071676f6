// mlxgraph's quantized product with int8 activations (an opt-in: Program.load's
// int8_activations; docs/precision.md states its rounding), as llama.cpp multiplies its
// q8_0/q4_0 weights:
//
//   y[m, n] = sum_c sum_lanes float(dot_i32(codes, xq)) * d_x[lane] * scale_w[n, group]
//             + sum_g bias_w[n, g] * xsum[m, g]
//
// Each row of x is rounded to int8 once per product, per block of 32 values (scale d =
// max|x| / 127, q = rint(x / d), as llama.cpp's q8_0 activations); W's codes are used as
// they are (unsigned 0..255 or 0..15), so the weight side stays exact, and the bias term
// keeps the float32 per-group sums of x. The integer dot products are exact (int32, at most
// 4 x 255 x 127 per lane per step), so the only rounding beyond float32 is x's.
//
// Why: the exact kernel (quantized_kernel.h) widens every code to a float and spends ~3
// vector instructions per 16 weights, which keeps it below the memory bandwidth (~10 GB/s of
// weights per thread on an EPYC); one AVX-512 VNNI instruction multiplies and sums 64 codes.
//
// Layout: a step of the kernel reads 64 bytes of a row of W (a "chunk": 64 weights at 8 bits,
// 128 at 4) and gives 16 int32 lanes, lane j the sum over bytes 4j..4j+3. At 4 bits a byte
// holds an even weight (low nibble) and the next, odd one: x is stored per chunk as its 64
// even values then its 64 odd ones, so the low nibbles meet the first and the high nibbles
// the second. int8_prepare.h writes, per row of x and chunk, the int8 values and each lane's
// x scale.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "int8_ops.h"
#include "int8_prepare.h"
#include "quantized_kernel.h"

namespace mlxgraph_native {

struct Int8Problem {
  const float* x;        // [M][K], contiguous
  const uint8_t* w;      // [N][K * bits / 8]
  const void* scales;    // [N][G], float32 or float16 (half_scales)
  const void* biases;
  float* y;              // [M][N]
  int m, n, k, bits, group_size;
  bool half_scales;
  int chunks = 0;                // per row of W: K * bits / 8 / CHUNK, rounded up
  const int8_t* xq = nullptr;    // [M][chunks][weights per chunk]
  const float* xd = nullptr;     // [M][chunks][16]: each lane's x scale
  const float* xsum = nullptr;   // [M][G]: per-group float32 sums of x
};

// Chunk c of R rows of W (their codes at code[r], their scales from sg[r], the chunk's first
// group) against rows [m0, m0 + MB) of x, into acc. SPLIT: the chunk spans several groups
// (group size below the chunk's weights), so each lane takes its own group's scale.
template <class S, int BITS, bool SPLIT, int R, int MB>
inline void int8_chunk(const Int8Problem& p, int m0, int c, const uint8_t* const (&code)[R],
                       const float* const (&sg)[R], typename S::F (&acc)[R][MB]) {
  using F = typename S::F;
  constexpr int WPC = weights_per_chunk(BITS);
  F sv[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    sv[r] = SPLIT ? S::groups(sg[r], LANES16 * p.group_size / WPC) : S::set1(sg[r][0]);
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) {
    const size_t at = (size_t)(m0 + m) * p.chunks + c;
    const int8_t* xq = p.xq + at * WPC;
    const F d = S::load(p.xd + at * LANES16);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const F dots = S::cvt(S::template dot<BITS>(code[r], xq));
      acc[r][m] = S::fma(dots, S::mul(d, sv[r]), acc[r][m]);
    }
  }
}

// Rows [r0, r0 + R) of W against rows [m0, m0 + MB) of x: the whole chunks of each row, then
// its last, partial one (a row of 32-value multiples ends mid-chunk) from zero-padded copies
// of its codes and scales, so nothing past the row is read.
template <class S, int BITS, bool SPLIT, int R, int MB>
inline void int8_tile(const Int8Problem& p, int r0, int m0, const float* s, const float* b,
                      size_t stride) {
  using F = typename S::F;
  constexpr int WPC = weights_per_chunk(BITS);
  const int groups = p.k / p.group_size;
  const size_t row_bytes = (size_t)p.k * BITS / 8;
  const int whole = (int)(row_bytes / CHUNK);
  const uint8_t* w = p.w + (size_t)r0 * row_bytes;
  F acc[R][MB];
#pragma GCC unroll 16
  for (int i = 0; i < R * MB; ++i) acc[i / MB][i % MB] = S::zero();
  for (int c = 0; c < whole; ++c) {
    const int g = c * WPC / p.group_size;   // the chunk's first group
    const uint8_t* code[R];
    const float* sg[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      code[r] = w + r * row_bytes + (size_t)c * CHUNK;
      sg[r] = s + r * stride + g;
      // a cache line per chunk: the same place of the row a tile below (quantized_kernel.h)
      __builtin_prefetch(w + (r + R) * row_bytes + (size_t)c * CHUNK);
    }
    int8_chunk<S, BITS, SPLIT, R, MB>(p, m0, c, code, sg, acc);
  }
  if (whole < p.chunks) {
    const int g = whole * WPC / p.group_size;
    const size_t tail = row_bytes - (size_t)whole * CHUNK;
    alignas(64) uint8_t padded[R][CHUNK] = {};
    float scales[R][LANES16 / 4] = {};   // a chunk spans at most 4 groups
    const uint8_t* code[R];
    const float* sg[R];
    for (int r = 0; r < R; ++r) {
      std::memcpy(padded[r], w + r * row_bytes + (size_t)whole * CHUNK, tail);
      for (int i = 0; i < LANES16 / 4 && g + i < groups; ++i) scales[r][i] = s[r * stride + g + i];
      code[r] = padded[r];
      sg[r] = scales[r];
    }
    int8_chunk<S, BITS, SPLIT, R, MB>(p, m0, whole, code, sg, acc);
  }
  for (int r = 0; r < R; ++r) {
    const float* br = b + r * stride;
    for (int m = 0; m < MB; ++m) {
      const float* xsum = p.xsum + (size_t)(m0 + m) * groups;
      int gi = 0;
      for (; gi + 16 <= groups; gi += 16)
        acc[r][m] = S::fma(S::load(br + gi), S::load(xsum + gi), acc[r][m]);
      float total = S::sum(acc[r][m]);
      for (; gi < groups; ++gi) total += br[gi] * xsum[gi];
      p.y[(size_t)(m0 + m) * p.n + r0 + r] = total;
    }
  }
}

// Rows [r0, r0 + R) of W against every row of x, blocks of up to 4 rows of x.
template <class S, int BITS, bool SPLIT, int R>
inline void int8_tile_rows(const Int8Problem& p, int r0, const float* s, const float* b,
                           size_t stride) {
  int m0 = 0;
  for (; m0 + 4 <= p.m; m0 += 4) {
    if constexpr (S::kWideTile) {   // 4 x 4 accumulators: each code load meets 4 rows of x
      int8_tile<S, BITS, SPLIT, R, 4>(p, r0, m0, s, b, stride);
    } else {
      for (int r = 0; r < R; ++r)
        int8_tile<S, BITS, SPLIT, 1, 4>(p, r0 + r, m0, s + r * stride, b + r * stride, stride);
    }
  }
  const int left = p.m - m0;
  if (left == 1) {
    int8_tile<S, BITS, SPLIT, R, 1>(p, r0, m0, s, b, stride);
  } else {
    for (int r = 0; r < R && left > 0; ++r) {
      const float *sr = s + r * stride, *br = b + r * stride;
      if (left == 2) int8_tile<S, BITS, SPLIT, 1, 2>(p, r0 + r, m0, sr, br, stride);
      else int8_tile<S, BITS, SPLIT, 1, 3>(p, r0 + r, m0, sr, br, stride);
    }
  }
}

// Rows [lo, hi) of W (lo a multiple of TILE); float16 scales and biases widened per tile.
// A one-row product at 8 bits reads W one row at a time: on an EPYC, 4 interleaved 1 KB
// streams (a tile of 4 rows) read ~9 GB/s on one thread, one stream ~17 GB/s (the integer
// work no longer hides the loads); at 4 bits the tile of 4 measured no slower.
template <class S, int BITS, bool SPLIT, bool HALF_SCALES>
inline void int8_rows(const Int8Problem& p, int lo, int hi) {
  tiles_with_scales<S, HALF_SCALES>(
      p, lo, hi, [&p](int r0, int rows, const float* s, const float* b, size_t groups) {
        if (rows == TILE && !(BITS == 8 && p.m == 1)) {
          int8_tile_rows<S, BITS, SPLIT, TILE>(p, r0, s, b, groups);
        } else {
          for (int r = 0; r < rows; ++r)
            int8_tile_rows<S, BITS, SPLIT, 1>(p, r0 + r, s + r * groups, b + r * groups,
                                              groups);
        }
      });
}

template <class S, int BITS, bool SPLIT>
inline void int8_rows_for_scales(const Int8Problem& p, int lo, int hi) {
  if (p.half_scales) int8_rows<S, BITS, SPLIT, true>(p, lo, hi);
  else int8_rows<S, BITS, SPLIT, false>(p, lo, hi);
}

// Every (bits, group span, scale dtype) variant for one instruction set.
template <class S>
inline void int8_rows_for(const Int8Problem& p, int lo, int hi) {
  const bool split = p.group_size < weights_per_chunk(p.bits);
  if (p.bits == 4) {
    if (split) int8_rows_for_scales<S, 4, true>(p, lo, hi);
    else int8_rows_for_scales<S, 4, false>(p, lo, hi);
  } else {
    if (split) int8_rows_for_scales<S, 8, true>(p, lo, hi);
    else int8_rows_for_scales<S, 8, false>(p, lo, hi);
  }
}

using Int8RowsFn = void (*)(const Int8Problem&, int, int);

__attribute__((flatten)) inline void int8_rows_generic(const Int8Problem& p, int lo, int hi) {
  int8_rows_for<GenericInt8Ops>(p, lo, hi);
}
#if defined(__x86_64__)
__attribute__((flatten)) MLXG_AVX512_VNNI inline void int8_rows_vnni(const Int8Problem& p,
                                                                    int lo, int hi) {
  int8_rows_for<Avx512VnniOps>(p, lo, hi);
}
__attribute__((flatten)) MLXG_AVX2 inline void int8_rows_avx2(const Int8Problem& p, int lo,
                                                              int hi) {
  int8_rows_for<Avx2Int8Ops>(p, lo, hi);
}
#endif

struct Int8Level {
  const char* name;
  Int8RowsFn rows;
  Int8PrepareFn prepare;   // x rounded by the same instruction set (int8_prepare.h)
};

// The levels this CPU runs, best first (tests and benchmarks may pick a lower one).
inline const std::vector<Int8Level>& int8_levels() {
  static const std::vector<Int8Level> all = [] {
    std::vector<Int8Level> out;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512vnni"))
      out.push_back({"avx512-vnni", int8_rows_vnni, prepare_row_vnni});
    if (__builtin_cpu_supports("x86-64-v3"))
      out.push_back({"avx2", int8_rows_avx2, prepare_row_avx2});
#endif
    out.push_back({"generic", int8_rows_generic, prepare_row_generic});
    return out;
  }();
  return all;
}

inline std::atomic<int> g_int8_level{0};  // index into int8_levels()

// x rounded to int8 (int8_prepare.h), its rows over the pool when there are enough of them
// (a prefill's); ``finite`` per row whether it holds only finite values.
inline void prepare_int8_x(Int8Problem& p, Int8PrepareFn prepare, std::vector<int8_t>& xq,
                           std::vector<float>& xd, std::vector<float>& xsum,
                           std::vector<uint8_t>& finite) {
  const int wpc = weights_per_chunk(p.bits), groups = p.k / p.group_size;
  p.chunks = (p.k + wpc - 1) / wpc;
  // resize, not assign: prepare_row writes every value the kernel reads, padding included
  xq.resize((size_t)p.m * p.chunks * wpc);
  xd.resize((size_t)p.m * p.chunks * LANES16);
  xsum.resize((size_t)p.m * groups);
  finite.resize(p.m);
  p.xq = xq.data();
  p.xd = xd.data();
  p.xsum = xsum.data();
  int8_t* const q = xq.data();
  float *const d = xd.data(), *const sums = xsum.data();
  uint8_t* const ok = finite.data();
  const float* const x = p.x;
  const int k = p.k, group_size = p.group_size, bits = p.bits;
  const size_t row_q = (size_t)p.chunks * wpc, row_d = (size_t)p.chunks * LANES16;
  // Rounding a value costs what ~14 (8 bits) to ~31 (4 bits) weights of a one-row product
  // do (0.57 / 0.80 ns against 0.042 / 0.026 on one EPYC thread), so parallel_rows' bound
  // keeps a decode step's few rows on this thread and splits a prefill's.
  parallel_rows(p.m, (long)p.m * p.k * 16, [=](int lo, int hi) {
    for (int m = lo; m < hi; ++m)
      ok[m] = prepare(x + (size_t)m * k, k, group_size, bits, q + m * row_q, d + m * row_d,
                      sums + (size_t)m * groups);
  });
}

// The whole product: x prepared, the rows of W over the pool; a row of x with a non-finite
// value is computed again by the exact kernel (its infinities and NaNs as the float
// arithmetic gives them).
inline void int8_product(Int8Problem& p) {
  if (p.m == 0 || p.n == 0) return;
  const Int8Level& level = int8_levels()[g_int8_level.load()];
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xd, xsum;
  thread_local std::vector<uint8_t> finite;
  prepare_int8_x(p, level.prepare, xq, xd, xsum, finite);
  const Int8Problem& q = p;
  const Int8RowsFn rows = level.rows;
  parallel_rows(p.n, (long)p.n * p.k, [&q, rows](int lo, int hi) { rows(q, lo, hi); }, TILE);
  for (int m = 0; m < p.m; ++m) {
    if (finite[m]) continue;
    QuantizedProblem exact{p.x + (size_t)m * p.k, p.w, p.scales, p.biases, p.y + (size_t)m * p.n,
                           1, p.n, p.k, p.bits, p.group_size, p.half_scales};
    quantized_product(exact);
  }
}

}  // namespace mlxgraph_native
