// Blocks of 16 floats in vector registers, shared by mlxgraph's native row kernels (vec_exp.h,
// attention_softmax.cpp, norm_rope_rows.h). GCC vector types: each caller's target (a clone,
// or a function compiled for one level) picks the instructions; always inlined.
#pragma once

#include <cstdint>
#include <cstring>

namespace mlxgraph_exp {

constexpr int VL = 16;  // floats per step (one AVX-512 register, two AVX2 ones)
typedef float vf __attribute__((vector_size(4 * VL)));
typedef int32_t vi __attribute__((vector_size(4 * VL)));

inline __attribute__((always_inline)) vf splat(float v) { return vf{} + v; }

// VL floats from p; a block of n < VL (a row's end) is padded with zeros. FULL blocks copy
// a constant size, which stays in registers.
template <bool FULL>
inline __attribute__((always_inline)) vf load(const float* p, int n) {
  vf v{};
  std::memcpy(&v, p, (FULL ? VL : n) * sizeof(float));
  return v;
}

template <bool FULL>
inline __attribute__((always_inline)) void store(float* p, vf v, int n) {
  std::memcpy(p, &v, (FULL ? VL : n) * sizeof(float));
}

}  // namespace mlxgraph_exp
