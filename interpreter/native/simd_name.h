// The instruction set a GCC target-clones dispatch picks on this CPU, for the stats line
// (quantized_matvec.cpp and activations.cpp clone their kernels for x86-64-v4/v3/default).
#pragma once

#include <string>

// The clone set simd_name() reports on: x86-64-v4 (AVX-512 F, BW, DQ, VL), v3 (AVX2 with
// FMA), default (SSE2); one definition for every native kernel.
#if defined(__x86_64__)
#define MLXG_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
// One function compiled for one level (kernels whose level tests and benchmarks pick).
#define MLXG_AVX512 __attribute__((target("arch=x86-64-v4")))
#define MLXG_AVX2 __attribute__((target("arch=x86-64-v3")))
#else
#define MLXG_CLONES
#endif

inline std::string simd_name() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "avx512 (x86-64-v4)";
  if (__builtin_cpu_supports("x86-64-v3")) return "avx2+fma (x86-64-v3)";
  return "baseline";
#elif defined(__aarch64__)
  return "neon";
#else
  return "baseline";
#endif
}
