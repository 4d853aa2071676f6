// mlxgraph's float32 attention softmax on the CPU, as an MLX primitive (the softmax between
// the two matrix products of interpreter/attention.py's explicit path).
//
// Why: MLX's CPU scaled_dot_product_attention falls back to its own ops, and their softmax
// calls the x86-64 wheel's scalar exp: 6 of the 7.6 ms of a 128-token, 16-head causal
// attention. This one computes exp in vector registers (vec_exp.h), applies the causal
// limit, a bool mask and the sink logits on the way, keeps the rounding error of max - score
// in the exponent, and sums in float64: each probability is within a few ulp of a float64
// softmax of the same float32 scores.

#include "attention_softmax.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"
#include "cpu_eval.h"
#include "simd_name.h"
#include "vec_exp.h"

namespace mx = mlx::core;

namespace mlxgraph_softmax {
namespace {

using namespace mlxgraph_exp;
typedef uint8_t vb __attribute__((vector_size(VL)));
typedef double vd __attribute__((vector_size(8 * VL)));
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// Which of the n keys of a block the row may see: the first n, where allow (null: all)
// is nonzero.
template <bool FULL>
inline __attribute__((always_inline)) vi allowed(const uint8_t* allow, int n) {
  vi ok = vi{} - 1;
  if (!FULL) {
    vi idx;
    for (int l = 0; l < VL; ++l) idx[l] = l;
    ok = idx < n;
  }
  if (allow) {
    vb bytes{};
    std::memcpy(&bytes, allow, FULL ? VL : n);
    ok &= __builtin_convertvector(bytes, vi) != 0;
  }
  return ok;
}

// exp(score - m) of a block (0 where not allowed), its sum added to acc in float64.
template <bool FULL>
inline __attribute__((always_inline)) void exp_block(const float* x, float* y, int n,
                                                     const uint8_t* allow, float m, vd& acc) {
  vf v = load<FULL>(x, n);
  // a = m - v exactly as a + lo (two-sum): a float32 m - v alone would cost exp up to
  // |m - v| / 2 ulp of relative error (~30 ulp for a spread of 60 in the scores)
  vf a = m - v, back = a - m, lo = (m - (a - back)) - (v + back);
  a = allowed<FULL>(allow, n) ? a : -splat(NEG_INF);  // masked keys: exp(-inf) = 0
  auto [pn, tail] = exp_neg(a, lo);
  vf e = pn * tail;
  e = a == a ? e : a;              // NaN (a NaN score, or +inf - +inf) stays NaN
  acc += __builtin_convertvector(e, vd);
  store<FULL>(y, e, n);
}

// One row of S scores into probabilities: keys j < limit with allow[j] (allow may be null).
MLXG_CLONES void softmax_row(const float* x, float* y, int s, int limit, const uint8_t* allow,
                             const float* sink) {
  if (limit > s) limit = s;
  int full = limit - limit % VL;
  auto mask_at = [allow](int j) { return allow ? allow + j : nullptr; };
  vf vmax = splat(NEG_INF);   // a NaN score is skipped here and caught in exp_block
  for (int j = 0; j < full; j += VL) {
    vf v = allowed<true>(mask_at(j), VL) ? load<true>(x + j, VL) : splat(NEG_INF);
    vmax = v > vmax ? v : vmax;
  }
  if (full < limit) {
    vf v = allowed<false>(mask_at(full), limit - full) ? load<false>(x + full, limit - full)
                                                        : splat(NEG_INF);
    vmax = v > vmax ? v : vmax;
  }
  float m = sink ? *sink : NEG_INF;
  for (int l = 0; l < VL; ++l) m = vmax[l] > m ? vmax[l] : m;
  vd acc{};
  for (int j = 0; j < full; j += VL) exp_block<true>(x + j, y + j, VL, mask_at(j), m, acc);
  if (full < limit)
    exp_block<false>(x + full, y + full, limit - full, mask_at(full), m, acc);
  double sum = sink ? std::exp((double)*sink - (double)m) : 0.0;
  for (int l = 0; l < VL; ++l) sum += acc[l];
  // past the causal limit: 0 / sum, which is 0 unless the whole row is NaN (no key, no sink)
  std::fill(y + limit, y + s, 0.0f / (float)sum);
  vf total = splat((float)sum);
  for (int j = 0; j < full; j += VL) store<true>(y + j, load<true>(y + j, VL) / total, VL);
  if (full < limit)
    store<false>(y + full, load<false>(y + full, limit - full) / total, limit - full);
}

// Shapes and strides the kernel needs, copied into the dispatched task.
struct Job {
  const float* x;
  float* y;
  int b, h, t, s;
  bool causal;
  const uint8_t* mask;       // null: no mask
  int64_t mstride[4];        // the mask's element strides over [B, H, T, S] (0: broadcast)
  const float* sinks;        // null: no sinks
};

// An input's layout, for one that eval_cpu finds is not row-contiguous.
struct View {
  bool rows;  // row-contiguous: read in place
  mx::Shape shape;
  mx::Strides strides;
};

void run(const Job& job) {
  std::vector<uint8_t> row;  // a mask row gathered when its keys are not contiguous
  if (job.mask && job.mstride[3] != 1) row.resize(job.s);
  long rows = (long)job.b * job.h * job.t;
  for (long r = 0; r < rows; ++r) {
    int i = (int)(r % job.t), head = (int)(r / job.t % job.h), batch = (int)(r / job.t / job.h);
    int limit = job.causal ? job.s - job.t + i + 1 : job.s;
    const uint8_t* allow = nullptr;
    if (job.mask) {
      allow = job.mask + batch * job.mstride[0] + head * job.mstride[1] + i * job.mstride[2];
      if (job.mstride[3] != 1) {
        for (int j = 0; j < job.s; ++j) row[j] = allow[j * job.mstride[3]];
        allow = row.data();
      }
    }
    const float* sink = job.sinks ? job.sinks + head : nullptr;
    softmax_row(job.x + r * job.s, job.y + r * job.s, job.s, limit, allow, sink);
  }
}

class AttentionSoftmax : public mx::Primitive {
 public:
  AttentionSoftmax(mx::Stream stream, bool causal, bool masked, bool sinks)
      : mx::Primitive(stream), causal_(causal), masked_(masked), sinks_(sinks) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    auto& out = outputs[0];
    auto& encoder = mlxgraph_eval::begin_eval(stream(), inputs, out);
    Job job{x.data<float>(), out.data<float>(), x.shape(0), x.shape(1), x.shape(2), x.shape(3),
            causal_, nullptr, {0, 0, 0, 0}, nullptr};
    size_t next = 1;
    if (masked_) {
      const auto& mask = inputs[next++];
      job.mask = reinterpret_cast<const uint8_t*>(mask.data<bool>());
      auto strides = mlxgraph_eval::broadcast_strides(mask, x.shape());
      for (int d = 0; d < 4; ++d) job.mstride[d] = strides[d];
    }
    const mx::array* sinks = sinks_ ? &inputs[next] : nullptr;
    if (sinks) job.sinks = sinks->data<float>();
    if (x.flags().row_contiguous && (!sinks || sinks->flags().row_contiguous)) {
      encoder.dispatch([job]() { run(job); });
      return;
    }
    // views (strided, broadcast): the scores gathered into out (softmax_row reads each block
    // before it writes it, so it runs in place), the sinks into a row of their own
    View xv{x.flags().row_contiguous, x.shape(), x.strides()};
    View sv{!sinks || sinks->flags().row_contiguous, sinks ? sinks->shape() : mx::Shape{},
            sinks ? sinks->strides() : mx::Strides{}};
    encoder.dispatch([job, xv = std::move(xv), sv = std::move(sv)]() mutable {
      std::vector<float> heads;
      if (!xv.rows) {
        mlxgraph_eval::gather(job.x, xv.shape, xv.strides, job.y);
        job.x = job.y;
      }
      if (!sv.rows) {
        heads.resize(job.h);
        mlxgraph_eval::gather(job.sinks, sv.shape, sv.strides, heads.data());
        job.sinks = heads.data();
      }
      run(job);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxgraph attention softmax runs on the CPU only");
  }

  const char* name() const override { return "MlxgraphAttentionSoftmax"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const AttentionSoftmax&>(other);
    return causal_ == o.causal_ && masked_ == o.masked_ && sinks_ == o.sinks_;
  }

 private:
  bool causal_, masked_, sinks_;
};

void refuse(const std::string& what) {
  throw std::invalid_argument("mlxgraph attention softmax: " + what);
}

}  // namespace

mx::array attention_softmax(const mx::array& scores, bool causal,
                            const std::optional<mx::array>& mask,
                            const std::optional<mx::array>& sinks) {
  if (scores.dtype() != mx::float32 || scores.ndim() != 4)
    refuse("scores must be float32 [B, H, T, S]");
  const auto& shape = scores.shape();
  if (causal && shape[2] > shape[3]) refuse("a causal mask needs at least T keys");
  auto s = mx::default_stream(mx::Device::cpu);
  // scores and sinks go in as they are, views included (no Contiguous nodes, ~1.2 us of
  // host time each per step): eval_cpu gathers a view
  std::vector<mx::array> inputs{scores};
  if (mask) {
    if (mask->dtype() != mx::bool_) refuse("the mask must be bool");
    // as it is: eval_cpu reads it with zero strides where it broadcasts (no Broadcast node)
    if (mx::broadcast_shapes(mask->shape(), shape) != shape)
      refuse("the mask does not broadcast to the scores' shape");
    inputs.push_back(*mask);
  }
  if (sinks) {
    if (sinks->dtype() != mx::float32 || sinks->ndim() != 1 || sinks->shape(0) != shape[1])
      refuse("sinks must be float32 [H]");
    inputs.push_back(*sinks);
  }
  auto primitive = std::make_shared<AttentionSoftmax>(s, causal, mask.has_value(),
                                                      sinks.has_value());
  return mx::array(shape, mx::float32, primitive, std::move(inputs));
}

}  // namespace mlxgraph_softmax
