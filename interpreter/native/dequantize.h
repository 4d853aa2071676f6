// mlxgraph's dequantize of MLX's packed weights on the CPU, for prefill-sized
// QuantizedLinear steps: segments of rows, a tile's k block at a time, for the tiled
// product (quantized_tile.h), or the whole weight before the BLAS matmul where that does
// not run (MLXGRAPH_QUANTIZED_PREFILL=off, no AVX-512F):
//
//   W[n, k] = scales[n, g] * code[n, k] + biases[n, g],   g = k / group_size,
//
// in float32 with one fused multiply-add (within half an ulp of the exact value), codes in
// MLX's packed layout (quantized_kernel.h: bytes in k order, at 4 bits the low nibble first),
// scales and biases float32 or float16. MLX's own CPU dequantize takes ~3 ns a weight here
// (8.4 ms for a 2816 x 1024 weight, more than the 128-row product that follows); this one
// widens a 16-byte block of codes in registers and writes 16 or 32 weights per step (the
// whole weight: rows of W shared over matvec_common.h's pool). AVX-512 (x86-64-v4) and a
// plain loop for the rest, the same values. Included by quantized_matvec.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "half_widen.h"
#include "matvec_common.h"
#include "quantized_kernel.h"

namespace mlxgraph_native {

// A weight W [n, k] in MLX's packed layout.
struct PackedWeight {
  const uint8_t* w;      // [n][k * bits / 8]
  const void* scales;    // [n][k / group_size], float32 or float16 (half_scales)
  const void* biases;
  int n, k, bits, group_size;
  bool half_scales;
};

struct DequantizeProblem {
  PackedWeight w;
  float* out;            // [n][k]
};

// Row n's scales and biases as float32 (float16 ones widened into the buffers).
inline void row_scales(const PackedWeight& p, int n, std::vector<float>& s,
                       std::vector<float>& b, const float** sp, const float** bp) {
  const int groups = p.k / p.group_size;
  if (!p.half_scales) {
    *sp = (const float*)p.scales + (size_t)n * groups;
    *bp = (const float*)p.biases + (size_t)n * groups;
    return;
  }
  s.resize(groups);
  b.resize(groups);
  widen<false>((const uint16_t*)p.scales + (size_t)n * groups, s.data(), groups);
  widen<false>((const uint16_t*)p.biases + (size_t)n * groups, b.data(), groups);
  *sp = s.data();
  *bp = b.data();
}

// A segment starts and ends on a multiple of this many weights: a whole 16-byte block of
// codes at either bits (16 at 8 bits, 32 at 4), and a group is a whole number of them.
constexpr int SEGMENT = 32;

// Weights [lo, hi) of row n of W into out[0, hi - lo), lo and hi multiples of SEGMENT; s
// and b are the row's float32 scales and biases (row_scales).
using SegmentFn = void (*)(const PackedWeight& p, const float* s, const float* b, int n,
                           int lo, int hi, float* out);

inline void dequantize_segment_plain(const PackedWeight& p, const float* s, const float* b,
                                     int n, int lo, int hi, float* out) {
  const uint8_t* codes = p.w + (size_t)n * p.k * p.bits / 8;
  for (int k = lo; k < hi; ++k) {
    const int code = p.bits == 8 ? codes[k] : (codes[k / 2] >> (4 * (k & 1))) & 15;
    const int g = k / p.group_size;
    out[k - lo] = __builtin_fmaf(s[g], (float)code, b[g]);
  }
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) inline void dequantize_segment_avx512(
    const PackedWeight& p, const float* s, const float* b, int n, int lo, int hi,
    float* out) {
  const int block_weights = p.bits == 8 ? 16 : 32;  // weights per 16-byte block
  // 4 bits: the low nibbles are the even weights, the high ones the odd: interleaved back
  // into k order by two permutes of the pair.
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i fifteen = _mm512_set1_epi32(15);
  const uint8_t* codes = p.w + ((size_t)n * p.k + lo) * p.bits / 8;
  for (int k = lo; k < hi; k += block_weights, codes += 16, out += block_weights) {
    const int g = k / p.group_size;  // a block never straddles groups (caller checks)
    const __m512 scale = _mm512_set1_ps(s[g]), bias = _mm512_set1_ps(b[g]);
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)codes));
    if (p.bits == 8) {
      _mm512_storeu_ps(out, _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(c), bias));
      continue;
    }
    const __m512 even = _mm512_cvtepi32_ps(_mm512_and_si512(c, fifteen));
    const __m512 odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4));
    _mm512_storeu_ps(out, _mm512_fmadd_ps(scale, _mm512_permutex2var_ps(even, first, odd),
                                          bias));
    _mm512_storeu_ps(out + 16, _mm512_fmadd_ps(
                                   scale, _mm512_permutex2var_ps(even, second, odd), bias));
  }
}
#endif

// The segment code for the quantized kernel's level (set_level): AVX-512's or the plain
// loop, the same values either way (one fused multiply-add per weight).
inline SegmentFn dequantize_segment() {
#if defined(__x86_64__)
  if (std::string(levels()[g_level.load()].name) == "avx512") return dequantize_segment_avx512;
#endif
  return dequantize_segment_plain;
}

// Every row of W, over the pool. The caller guarantees bits 4 or 8 and whole 16-byte
// blocks per group (group_size * bits / 8 a multiple of 16).
inline void dequantize(const DequantizeProblem& p) {
  if (p.w.n == 0 || p.w.k == 0) return;
  const SegmentFn segment = dequantize_segment();
  parallel_rows(p.w.n, (long)p.w.n * p.w.k, [&p, segment](int lo, int hi) {
    thread_local std::vector<float> sbuf, bbuf;
    for (int n = lo; n < hi; ++n) {
      const float *s, *b;
      row_scales(p.w, n, sbuf, bbuf, &s, &b);
      segment(p.w, s, b, n, 0, p.w.k, p.out + (size_t)n * p.w.k);
    }
  });
}

}  // namespace mlxgraph_native
