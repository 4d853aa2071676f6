// The integer parts of the int8 kernel (int8_kernel.h) per instruction set: a 64-byte chunk
// of codes against x's int8 values as 16 int32 lanes (lane j: bytes 4j..4j+3), its
// conversion to float, and each lane's group scale; the float parts are the exact kernel's
// ops (quantized_kernel.h).
#pragma once

#include <cstdint>

#include "quantized_kernel.h"

namespace mlxgraph_native {

constexpr int CHUNK = 64;   // bytes of codes per step
constexpr int XBLOCK = 32;  // x values per int8 scale
constexpr int LANES16 = 16;

typedef int32_t v16i __attribute__((vector_size(64)));

// Integer parts per instruction set; the float parts are the exact kernel's (quantized_kernel.h).
struct GenericInt8Ops : GenericOps {
  static constexpr bool kWideTile = false;   // whether R x 4 accumulators fit the registers
  using I = v16i;
  template <int BITS>
  static I dot(const uint8_t* c, const int8_t* xq) {
    I out;
    for (int j = 0; j < LANES16; ++j) {
      int32_t t = 0;
      for (int i = 4 * j; i < 4 * j + 4; ++i) {
        if constexpr (BITS == 8) {
          t += (int32_t)c[i] * xq[i];
        } else {
          t += (int32_t)(c[i] & 15) * xq[i] + (int32_t)(c[i] >> 4) * xq[64 + i];
        }
      }
      out[j] = t;
    }
    return out;
  }
  static F cvt(I v) { return __builtin_convertvector(v, F); }
  static F mul(F a, F b) { return a * b; }
  static F set1(float s) { return F{} + s; }
  // Lane j: s[j / lanes_per_group] (a chunk spanning 16 / lanes_per_group groups).
  static F groups(const float* s, int lanes_per_group) {
    F out;
    for (int j = 0; j < LANES16; ++j) out[j] = s[j / lanes_per_group];
    return out;
  }
};

#if defined(__x86_64__)
#define MLXG_AVX512_VNNI __attribute__((target("arch=x86-64-v4,avx512vnni")))

struct Avx512VnniOps : Avx512Ops {
  static constexpr bool kWideTile = true;    // 16 accumulators of 32 zmm
  using I = __m512i;
  template <int BITS>
  MLXG_AVX512_VNNI static I dot(const uint8_t* c, const int8_t* xq) {
    const __m512i codes = _mm512_loadu_si512(c);
    if constexpr (BITS == 8) {
      return _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512(xq));
    } else {
      const __m512i nib = _mm512_set1_epi8(15);
      const __m512i lo = _mm512_and_si512(codes, nib);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), nib);
      const __m512i even = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
      return _mm512_dpbusd_epi32(even, hi, _mm512_loadu_si512(xq + 64));
    }
  }
  MLXG_AVX512_VNNI static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  MLXG_AVX512_VNNI static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  MLXG_AVX512_VNNI static F set1(float s) { return _mm512_set1_ps(s); }
  MLXG_AVX512_VNNI static F groups(const float* s, int lanes_per_group) {
    const int shift = lanes_per_group == 8 ? 3 : 2;   // 8 or 4 lanes per group
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __mmask16 have = (__mmask16)((1u << (LANES16 >> shift)) - 1);
    return _mm512_permutexvar_ps(_mm512_srli_epi32(lane, shift), _mm512_maskz_loadu_ps(have, s));
  }
};

// AVX2 has no unsigned-by-signed int32 dot product; _mm256_maddubs_epi16 multiplies unsigned
// by signed bytes into saturating int16 pairs. At 4 bits a pair is at most 2 x 15 x 127: no
// saturation. At 8 bits 2 x 255 x 127 would saturate, so a code goes in as its two nibbles,
// c = 16 h + l, each pair at most 2 x 15 x 127, and the high one's pairs count 16 times: the
// same exact sum.
struct Avx2Int8Ops : Avx2Ops {
  static constexpr bool kWideTile = false;   // 16 ymm: 4 x 4 pairs would spill
  struct I {
    __m256i a, b;
  };
  template <int BITS>
  MLXG_AVX2 static __m256i half(const uint8_t* c, const int8_t* xq, int h) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i nib = _mm256_set1_epi8(15);
    const __m256i codes = _mm256_loadu_si256((const __m256i*)(c + 32 * h));
    const __m256i lo = _mm256_and_si256(codes, nib);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), nib);
    if constexpr (BITS == 8) {
      const __m256i q = _mm256_loadu_si256((const __m256i*)(xq + 32 * h));
      return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, q), ones),
                              _mm256_madd_epi16(_mm256_maddubs_epi16(hi, q),
                                                _mm256_set1_epi16(16)));
    } else {
      const __m256i even = _mm256_loadu_si256((const __m256i*)(xq + 32 * h));
      const __m256i odd = _mm256_loadu_si256((const __m256i*)(xq + 64 + 32 * h));
      const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, even),
                                             _mm256_maddubs_epi16(hi, odd));
      return _mm256_madd_epi16(pairs, ones);
    }
  }
  template <int BITS>
  MLXG_AVX2 static I dot(const uint8_t* c, const int8_t* xq) {
    return {half<BITS>(c, xq, 0), half<BITS>(c, xq, 1)};
  }
  MLXG_AVX2 static F cvt(I v) { return {_mm256_cvtepi32_ps(v.a), _mm256_cvtepi32_ps(v.b)}; }
  MLXG_AVX2 static F mul(F x, F y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
  MLXG_AVX2 static F set1(float s) { return {_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
  MLXG_AVX2 static F groups(const float* s, int lanes_per_group) {
    if (lanes_per_group == 8) return {_mm256_set1_ps(s[0]), _mm256_set1_ps(s[1])};
    return {_mm256_set_m128(_mm_set1_ps(s[1]), _mm_set1_ps(s[0])),
            _mm256_set_m128(_mm_set1_ps(s[3]), _mm_set1_ps(s[2]))};
  }
};
#endif

}  // namespace mlxgraph_native
