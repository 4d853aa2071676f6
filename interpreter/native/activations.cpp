// mlxgraph's float32 sigmoid and SiLU on the CPU, as an MLX primitive. Built at install by
// setup.py (optional); interpreter/native/activations.py loads it and falls back to
// MLX's own ops without it.
//
// Why: the mlx[cpu] wheel for x86-64 computes exp (and so sigmoid) one element at a time,
// with a library call per fused multiply-add: ~16-20 M elements/s here, so the SiLU of a
// 128-token prefill of a 1024/2816 model took ~20% of the prefill. This kernel computes
// exp(-|x|) in vector registers (vec_exp.h; GCC target clones: AVX-512, AVX2, baseline),
// then sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) below, e = exp(-|x|). Max error
// about 3 ulp against float64 (tests/test_native_activations.py); NaN stays NaN.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "attention_softmax.h"
#include "cpu_eval.h"
#include "mlx/primitives.h"
#include "norm_rope.h"
#include "simd_name.h"
#include "vec_exp.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

using namespace mlxgraph_exp;

// sigmoid of VL values; silu multiplies by x.
inline __attribute__((always_inline)) vf sigmoid_vec(vf x, bool silu) {
  auto [pn, tail] = exp_neg(x < 0 ? -x : x);  // e = exp(-|x|) = pn * tail (0 for NaN)
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
    auto& encoder = mlxgraph_eval::begin_eval(stream(), inputs, out);
    const float* src = x.data<float>();
    float* dst = out.data<float>();
    size_t n = x.size();
    bool silu = silu_;
    if (x.flags().row_contiguous) {
      encoder.dispatch([src, dst, n, silu]() { run(src, dst, n, silu); });
    } else {  // a view (strided, broadcast): gathered into out, then computed in place
      encoder.dispatch([src, dst, n, silu, shape = x.shape(), strides = x.strides()]() {
        mlxgraph_eval::gather(src, shape, strides, dst);
        run(dst, dst, n, silu);
      });
    }
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

// x goes in as it is, a view included (no Contiguous node: eval_cpu gathers a view).
mx::array activation(const mx::array& x, bool silu) {
  if (x.dtype() != mx::float32)
    throw std::invalid_argument("mlxgraph activations: float32 input only");
  auto s = mx::default_stream(mx::Device::cpu);
  return mx::array(x.shape(), mx::float32, std::make_shared<Activation>(s, silu), {x});
}

}  // namespace

NB_MODULE(_activations, m) {
  nb::module_::import_("mlx.core");  // registers mlx.core.array with nanobind first
  m.def("sigmoid", [](const mx::array& x) { return activation(x, false); }, nb::arg("x"),
        "sigmoid(x) for float32 x (lazy MLX array).");
  m.def("silu", [](const mx::array& x) { return activation(x, true); }, nb::arg("x"),
        "x * sigmoid(x) for float32 x (lazy MLX array).");
  m.def("attention_softmax", &mlxgraph_softmax::attention_softmax, nb::arg("scores"),
        nb::arg("causal"), nb::arg("mask").none(), nb::arg("sinks").none(),
        "Masked softmax of float32 attention scores [B, H, T, S] (lazy MLX array).");
  m.def("rms_norm", &mlxgraph_norm::rms_norm, nb::arg("x"), nb::arg("weight").none(),
        nb::arg("eps"), "RMSNorm of float32 x over its last axis, times a float32 weight [D].");
  m.def("rope", &mlxgraph_norm::rope, nb::arg("x"), nb::arg("cos"), nb::arg("sin"),
        "Rotate-half RoPE x * cos + concat(-x2, x1) * sin of float32 operands.");
  m.def("levels", &mlxgraph_norm::levels,
        "The RMSNorm and RoPE kernels' instruction-set levels this CPU runs, best first.");
  m.def("set_level", &mlxgraph_norm::set_level, nb::arg("name"),
        "Run the RMSNorm and RoPE kernels' code for ``name`` (tests, benchmarks).");
  m.def("level", &mlxgraph_norm::level, "The RMSNorm and RoPE kernels' current level.");
  m.def("simd", &simd_name, "The instruction set the kernel's dispatch picks on this CPU.");
}
