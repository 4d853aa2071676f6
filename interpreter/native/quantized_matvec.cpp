// mlxgraph's quantized matrix-vector product on the CPU, as an MLX primitive
// (docs/architecture.md#quantized-weights), and the module of the native kernels (the half
// precision one is half_matvec.h). Built at install by setup.py (optional);
// interpreter/quantized_native.py loads it and falls back to MLX's own ops without it.
//
// y[m, n] = sum_g scales[n, g] * dot(codes[n, g, :], x[m, g, :]) + biases[n, g] * xsum[m, g]
// for M <= MAX_ROWS float32 rows x [M, K] and a weight in MLX's packed layout: uint32 words
// of 32 / bits codes, the first in the lowest bits; float32 or float16 scales and biases.
// x is first split into planes, plane j holding the values that meet code j of each word,
// so one vector of consecutive words meets one vector of consecutive x values per plane:
// no gathers, and every code is unpacked once per block of 4 rows of x (a row of W is read
// from memory once for all M). Runtime dispatch: GCC target clones (AVX-512, AVX2,
// baseline) on x86-64; NEON is the aarch64 baseline. Rows of W are split over threads.

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "half_matvec.h"
#include "matvec_common.h"
#include "simd_name.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

using namespace mlxgraph_native;

struct Problem {
  const float* planes;   // [M][codes per word][K / codes per word]
  const float* xsum;     // [M][groups]
  const uint32_t* w;     // [N][K * bits / 32]
  const void* scales;    // [N][groups], float32 or float16 (half_scales)
  const void* biases;
  float* y;              // [M][N]
  int m, n, k, bits, group_size;
  bool half_scales;
};

// Rows [m0, m0 + M) of x against row r of W, whose scales and biases (float32) are
// ``scales`` and ``biases``. Words per group is a multiple of LANES. M is a template
// parameter so the accumulators stay in registers.
template <int BITS, int M>
__attribute__((always_inline)) inline void row_dot(const Problem& p, int r, int m0,
                                                   const float* scales, const float* biases) {
  constexpr int PER_WORD = 32 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1;
  const int words = p.k / PER_WORD, groups = p.k / p.group_size;
  const int wpg = words / groups;
  const uint32_t* wr = p.w + (size_t)r * words;
  const float* planes = p.planes + (size_t)m0 * PER_WORD * words;
  v8f acc[M] = {};
  for (int g = 0; g < groups; ++g) {
    v8f part[M] = {};
    for (int i = g * wpg; i < (g + 1) * wpg; i += LANES) {
      v8u word;
      std::memcpy(&word, wr + i, sizeof(word));
#pragma GCC unroll 8
      for (int j = 0; j < PER_WORD; ++j) {
        // Codes fit in 8 bits: a signed conversion (one instruction on every level).
        v8i code = (v8i)((word >> (uint32_t)(BITS * j)) & MASK);
        v8f c = __builtin_convertvector(code, v8f);
        for (int m = 0; m < M; ++m) {
          v8f xv;
          std::memcpy(&xv, planes + ((size_t)m * PER_WORD + j) * words + i, sizeof(xv));
          part[m] += c * xv;
        }
      }
    }
    const float s = scales[g];
    for (int m = 0; m < M; ++m) acc[m] += s * part[m];
  }
  for (int m = 0; m < M; ++m) {
    float total = 0;
    for (int l = 0; l < LANES; ++l) total += acc[m][l];
    const float* xs = p.xsum + (size_t)(m0 + m) * groups;
    for (int g = 0; g < groups; ++g) total += biases[g] * xs[g];
    p.y[(size_t)(m0 + m) * p.n + r] = total;
  }
}

// Rows [lo, hi) of W against every row of x, in blocks of up to 4 rows of x: a row of W
// (at most a few KB) is read from memory once and stays in L1 for the later blocks.
// float16 scales and biases are widened a row at a time.
template <int BITS, bool HALF_SCALES>
MLXG_CLONES void rows_kernel(const Problem& p, int lo, int hi) {
  const int groups = p.k / p.group_size;
  std::vector<float> wide(HALF_SCALES ? 2 * groups : 0);
  for (int r = lo; r < hi; ++r) {
    const float *s, *b;
    if constexpr (HALF_SCALES) {
      const size_t at = (size_t)r * groups;
      widen<false>(static_cast<const uint16_t*>(p.scales) + at, wide.data(), groups);
      widen<false>(static_cast<const uint16_t*>(p.biases) + at, wide.data() + groups, groups);
      s = wide.data(), b = wide.data() + groups;
    } else {
      s = static_cast<const float*>(p.scales) + (size_t)r * groups;
      b = static_cast<const float*>(p.biases) + (size_t)r * groups;
    }
    int m0 = 0;
    for (; m0 + 4 <= p.m; m0 += 4) row_dot<BITS, 4>(p, r, m0, s, b);
    switch (p.m - m0) {
      case 1: row_dot<BITS, 1>(p, r, m0, s, b); break;
      case 2: row_dot<BITS, 2>(p, r, m0, s, b); break;
      case 3: row_dot<BITS, 3>(p, r, m0, s, b); break;
      default: break;
    }
  }
}

template <bool HALF_SCALES>
void rows_for_scales(const Problem& p, int lo, int hi) {
  if (p.bits == 4) rows_kernel<4, HALF_SCALES>(p, lo, hi);
  else rows_kernel<8, HALF_SCALES>(p, lo, hi);
}

void dispatch_rows(const Problem& p, int lo, int hi) {
  if (p.half_scales) rows_for_scales<true>(p, lo, hi);
  else rows_for_scales<false>(p, lo, hi);
}

void matvec(Problem& p) {
  if (p.m == 0 || p.n == 0) return;
  const int per_word = 32 / p.bits, words = p.k / per_word, groups = p.k / p.group_size;
  const int gsz = p.group_size;
  std::vector<float> planes((size_t)p.m * p.k), xsum((size_t)p.m * groups);
  const float* x = p.planes;  // the caller passes x here; replaced by the planes below
  for (int m = 0; m < p.m; ++m) {
    const float* xm = x + (size_t)m * p.k;
    for (int i = 0; i < words; ++i)
      for (int j = 0; j < per_word; ++j)
        planes[((size_t)m * per_word + j) * words + i] = xm[i * per_word + j];
    for (int g = 0; g < groups; ++g) {
      float s = 0;
      for (int t = 0; t < gsz; ++t) s += xm[g * gsz + t];
      xsum[(size_t)m * groups + g] = s;
    }
  }
  p.planes = planes.data();
  p.xsum = xsum.data();
  parallel_rows(p.n, (long)p.n * p.k, [&](int lo, int hi) { dispatch_rows(p, lo, hi); });
}

class QuantizedMatvec : public mx::Primitive {
 public:
  QuantizedMatvec(mx::Stream stream, int group_size, int bits)
      : mx::Primitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    const auto& scales = inputs[2];
    const auto& biases = inputs[3];
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_input_array(scales);
    encoder.set_input_array(biases);
    encoder.set_output_array(out);
    Problem p{x.data<float>(), nullptr, w.data<uint32_t>(), scales.data<void>(),
              biases.data<void>(), out.data<float>(), (int)(x.size() / x.shape(-1)),
              (int)w.shape(0), (int)x.shape(-1), bits_, group_size_,
              scales.dtype() == mx::float16};
    encoder.dispatch([p]() mutable { matvec(p); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxgraph QuantizedMatvec runs on the CPU only");
  }

  const char* name() const override { return "MlxgraphQuantizedMatvec"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QuantizedMatvec&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }

 private:
  int group_size_, bits_;
};

// The checks the kernel relies on; the Python side only calls it for eligible shapes.
mx::array quantized_matvec(const mx::array& x_in, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int group_size, int bits) {
  if ((bits != 4 && bits != 8) || group_size * bits / 32 % LANES != 0)
    throw std::invalid_argument("quantized_matvec: unsupported bits or group size");
  if (x_in.dtype() != mx::float32 || w.dtype() != mx::uint32 || w.ndim() != 2 ||
      (scales.dtype() != mx::float32 && scales.dtype() != mx::float16) ||
      biases.dtype() != scales.dtype())
    throw std::invalid_argument(
        "quantized_matvec: float32 x, uint32 w, float32 or float16 scales and biases");
  const int k = x_in.shape(-1);
  if ((long)w.shape(1) * 32 / bits != k || k % group_size != 0 ||
      x_in.size() / k > MAX_ROWS || scales.shape(0) != w.shape(0) ||
      scales.shape(1) != k / group_size || biases.shape() != scales.shape())
    throw std::invalid_argument("quantized_matvec: shapes do not match");
  auto s = mx::default_stream(mx::Device::cpu);
  auto x = mx::contiguous(x_in, false, s);
  auto shape = x.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<QuantizedMatvec>(s, group_size, bits),
                   {x, mx::contiguous(w, false, s), mx::contiguous(scales, false, s),
                    mx::contiguous(biases, false, s)});
}

}  // namespace

NB_MODULE(_quantized_matvec, m) {
  nb::module_::import_("mlx.core");  // registers mlx.core.array with nanobind first
  m.def("quantized_matvec", &quantized_matvec, nb::arg("x"), nb::arg("w"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("group_size"), nb::arg("bits"),
        "x @ dequantize(w).T for float32 x of at most 8 rows (lazy MLX array).");
  m.def("half_matvec", &half_matvec, nb::arg("x"), nb::arg("w"),
        "x @ w.T in float32 for float16 or bfloat16 x of at most 8 rows and w of x's dtype.");
  m.def("simd", &simd_name, "The instruction set the kernel's dispatch picks on this CPU.");
  m.def("set_threads", [](int n) { g_threads = n < 1 ? 1 : n; }, nb::arg("threads"));
  m.def("threads", [] { return g_threads.load(); });
  m.attr("MAX_ROWS") = MAX_ROWS;
}
