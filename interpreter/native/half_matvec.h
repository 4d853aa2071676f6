// mlxgraph's float16 / bfloat16 matrix-vector product on the CPU, as an MLX primitive:
// y[m, n] = sum_k float(x[m, k]) * float(W[n, k]) in float32, for M <= MAX_ROWS rows of x and
// W [N, K] in the same half dtype as x (a Linear's weight as stored). MLX's own CPU product
// in half precision is a plain loop (~25-50x slower than float32 BLAS here); this one
// widens 8 weights per step with integer vector operations (bfloat16: a shift; float16: a
// dozen integer operations, exact for subnormals, infinities and NaN: GCC 12 does not
// emit F16C's vcvtph2ps from vector code, and target clones cannot hold the intrinsic) and
// reads each row of W once for all rows of x. The float32 result is rounded to the half
// dtype by the caller (interpreter/kernels/linalg.py). Included by quantized_matvec.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu_eval.h"
#include "half_widen.h"
#include "matvec_common.h"
#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxgraph_native {

namespace hmx = mlx::core;

// ``a`` itself when it is evaluated and row-contiguous (a graph's constants), else through
// mx::contiguous: 4 fewer graph nodes per quantized product to build and schedule.
inline hmx::array row_major(const hmx::array& a, const hmx::Stream& s) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return hmx::contiguous(a, false, s);
}

using mlxgraph_eval::gather;  // (cpu_eval.h; quantized_matvec.cpp gathers its views)

struct HalfProblem {
  const float* x;        // [M][K], widened
  const uint16_t* w;     // [N][K], float16 or bfloat16 bits
  float* y;              // [M][N]
  int m, n, k;
  bool bf16;
};

// Rows [m0, m0 + M) of x against row r of W; K is a multiple of 16 (two accumulators).
template <bool BF16, int M>
__attribute__((always_inline)) inline void half_row_dot(const HalfProblem& p, int r, int m0) {
  const uint16_t* wr = p.w + (size_t)r * p.k;
  v8f acc[M][2] = {};
  for (int k = 0; k < p.k; k += 16) {
    const v8f w0 = widen8<BF16>(wr + k), w1 = widen8<BF16>(wr + k + 8);
    for (int m = 0; m < M; ++m) {
      v8f x0, x1;
      const float* xm = p.x + (size_t)(m0 + m) * p.k + k;
      std::memcpy(&x0, xm, sizeof(x0));
      std::memcpy(&x1, xm + 8, sizeof(x1));
      acc[m][0] += w0 * x0;
      acc[m][1] += w1 * x1;
    }
  }
  for (int m = 0; m < M; ++m) {
    const v8f both = acc[m][0] + acc[m][1];
    float total = 0;
    for (int l = 0; l < LANES; ++l) total += both[l];
    p.y[(size_t)(m0 + m) * p.n + r] = total;
  }
}

template <bool BF16>
MLXG_CLONES void widen_x(const uint16_t* src, float* dst, size_t n) { widen<BF16>(src, dst, n); }

template <bool BF16>
MLXG_CLONES void half_rows(const HalfProblem& p, int lo, int hi) {
  for (int r = lo; r < hi; ++r) {
    int m0 = 0;
    for (; m0 + 4 <= p.m; m0 += 4) half_row_dot<BF16, 4>(p, r, m0);
    switch (p.m - m0) {
      case 1: half_row_dot<BF16, 1>(p, r, m0); break;
      case 2: half_row_dot<BF16, 2>(p, r, m0); break;
      case 3: half_row_dot<BF16, 3>(p, r, m0); break;
      default: break;
    }
  }
}

class HalfMatvec : public hmx::Primitive {
 public:
  explicit HalfMatvec(hmx::Stream stream) : hmx::Primitive(stream) {}

  void eval_cpu(const std::vector<hmx::array>& inputs, std::vector<hmx::array>& outputs) override {
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    auto& out = outputs[0];
    auto& encoder = mlxgraph_eval::begin_eval(stream(), inputs, out);
    const bool bf16 = x.dtype() == hmx::bfloat16;
    HalfProblem p{nullptr, w.data<uint16_t>(), out.data<float>(), (int)(x.size() / x.shape(-1)),
                  (int)w.shape(0), (int)x.shape(-1), bf16};
    const uint16_t* xh = x.data<uint16_t>();
    encoder.dispatch([p, xh]() mutable {
      if (p.m == 0 || p.n == 0) return;
      std::vector<float> xf((size_t)p.m * p.k);
      if (p.bf16) widen_x<true>(xh, xf.data(), xf.size());
      else widen_x<false>(xh, xf.data(), xf.size());
      p.x = xf.data();
      parallel_rows(p.n, (long)p.n * p.k, [&](int lo, int hi) {
        if (p.bf16) half_rows<true>(p, lo, hi);
        else half_rows<false>(p, lo, hi);
      });
    });
  }

  void eval_gpu(const std::vector<hmx::array>&, std::vector<hmx::array>&) override {
    throw std::runtime_error("mlxgraph HalfMatvec runs on the CPU only");
  }

  const char* name() const override { return "MlxgraphHalfMatvec"; }

  bool is_equivalent(const hmx::Primitive&) const override { return true; }
};

// x @ W.T in float32 for half x of at most MAX_ROWS rows and W [N, K] of x's dtype.
inline hmx::array half_matvec(const hmx::array& x_in, const hmx::array& w) {
  const auto dt = x_in.dtype();
  if ((dt != hmx::float16 && dt != hmx::bfloat16) || w.dtype() != dt || w.ndim() != 2)
    throw std::invalid_argument("half_matvec: x and a 2-D w, both float16 or both bfloat16");
  const int k = x_in.shape(-1);
  if (w.shape(1) != k || k % 16 != 0 || x_in.size() / k > MAX_ROWS)
    throw std::invalid_argument("half_matvec: shapes do not match");
  auto s = hmx::default_stream(hmx::Device::cpu);
  auto x = hmx::contiguous(x_in, false, s);
  auto shape = x.shape();
  shape.back() = w.shape(0);
  return hmx::array(shape, hmx::float32, std::make_shared<HalfMatvec>(s), {x, row_major(w, s)});
}

}  // namespace mlxgraph_native
