// mlxgraph's float32 sigmoid and SiLU on the CPU, as an MLX primitive. Built at install by
// setup.py (optional); interpreter/native_activations.py loads it and falls back to
// MLX's own ops without it.
//
// Why: the mlx[cpu] wheel for x86-64 computes exp (and so sigmoid) one element at a time,
// with a library call per fused multiply-add: ~16-20 M elements/s here, so the SiLU of a
// 128-token prefill of a 1024/2816 model took ~20% of the prefill. This kernel computes
// exp(-|x|) in vector registers (GCC target clones: AVX-512, AVX2, baseline):
//   |x| = n ln2 + r, |r| <= ln2 / 2 (ln2 split in two parts so n ln2 is exact enough),
//   exp(-r) by its Taylor series to degree 7 (truncation < 0.2 ulp on that interval),
//   2^-n from the exponent bits (in two factors, so results down to the subnormals are right),
// then sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) below, e = exp(-|x|). Max error
// about 3 ulp against float64 (tests/test_native_activations.py); NaN stays NaN.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "simd_name.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

constexpr int VL = 16;  // floats per step (one AVX-512 register, two AVX2 ones)
typedef float vf __attribute__((vector_size(4 * VL)));
typedef int32_t vi __attribute__((vector_size(4 * VL)));

constexpr float LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693145751953125f;       // ln2's leading bits: n * LN2_HI is exact
constexpr float LN2_LO = 1.42860676533018700e-06f; // ln2 - LN2_HI
// Past this, exp(-|x|) and |x| exp(-|x|) both round to 0 in float32 (below 2^-150).
constexpr float MAX_ARG = 112.0f;

inline vf splat(float v) { return vf{} + v; }

// 2^-m for 0 <= m <= 126, from the exponent bits (a normal float; m <= 81 here).
inline __attribute__((always_inline)) vf exp2_neg(vi m) { return (vf)((127 - m) << 23); }

// sigmoid of VL values; silu multiplies by x.
inline __attribute__((always_inline)) vf sigmoid_vec(vf x, bool silu) {
  vf a = x < 0 ? -x : x;
  vi inside = a < MAX_ARG;                      // false for NaN too (restored at the end)
  a = inside ? a : splat(MAX_ARG);
  vi n = __builtin_convertvector(a * LOG2E + 0.5f, vi);  // round(a / ln2), a >= 0
  vf nf = __builtin_convertvector(n, vf);
  vf r = (a - nf * LN2_HI) - nf * LN2_LO;       // |x| = n ln2 + r
  // exp(-r) = sum (-r)^k / k!, Horner from degree 7
  vf p = splat(-1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r - 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r - 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r - 1.0f;
  p = p * r + 1.0f;
  // exp(-|x|) = p 2^-n1 2^-n2, n1 + n2 = n: each factor normal, and the last product
  // rounds once into the subnormal range where exp(-|x|) lies there.
  vi n1 = n >> 1;
  vf pn = p * exp2_neg(n1), tail = exp2_neg(n - n1);
  tail = inside ? tail : vf{};                  // exp(-|x|) = 0 past MAX_ARG, whatever x is
  vf s = 1.0f / (1.0f + pn * tail);
  vf y;
  if (silu) {
    vf xs = x * s;
    y = x >= 0 ? xs : (xs * pn) * tail;         // x e / (1 + e), small factors last
  } else {
    y = x >= 0 ? s : (s * pn) * tail;           // e / (1 + e)
  }
  return x == x ? y : x;                        // NaN in, NaN out
}

MLXG_CLONES void run(const float* x, float* y, size_t n, bool silu) {
  size_t i = 0;
  for (; i + VL <= n; i += VL) {
    vf v;
    std::memcpy(&v, x + i, sizeof v);
    v = sigmoid_vec(v, silu);
    std::memcpy(y + i, &v, sizeof v);
  }
  if (i < n) {  // the tail through the same arithmetic, in a padded vector
    vf v{};
    std::memcpy(&v, x + i, (n - i) * sizeof(float));
    v = sigmoid_vec(v, silu);
    std::memcpy(y + i, &v, (n - i) * sizeof(float));
  }
}

class Activation : public mx::Primitive {
 public:
  Activation(mx::Stream stream, bool silu) : mx::Primitive(stream), silu_(silu) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_output_array(out);
    const float* src = x.data<float>();
    float* dst = out.data<float>();
    size_t n = x.size();
    bool silu = silu_;
    encoder.dispatch([src, dst, n, silu]() { run(src, dst, n, silu); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxgraph activations run on the CPU only");
  }

  const char* name() const override { return silu_ ? "MlxgraphSilu" : "MlxgraphSigmoid"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return silu_ == static_cast<const Activation&>(other).silu_;
  }

 private:
  bool silu_;
};

mx::array activation(const mx::array& x_in, bool silu) {
  if (x_in.dtype() != mx::float32)
    throw std::invalid_argument("mlxgraph activations: float32 input only");
  auto s = mx::default_stream(mx::Device::cpu);
  auto x = mx::contiguous(x_in, false, s);
  return mx::array(x.shape(), mx::float32, std::make_shared<Activation>(s, silu), {x});
}

}  // namespace

NB_MODULE(_activations, m) {
  nb::module_::import_("mlx.core");  // registers mlx.core.array with nanobind first
  m.def("sigmoid", [](const mx::array& x) { return activation(x, false); }, nb::arg("x"),
        "sigmoid(x) for float32 x (lazy MLX array).");
  m.def("silu", [](const mx::array& x) { return activation(x, true); }, nb::arg("x"),
        "x * sigmoid(x) for float32 x (lazy MLX array).");
  m.def("simd", &simd_name, "The instruction set the kernel's dispatch picks on this CPU.");
}
