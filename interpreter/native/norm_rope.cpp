// mlxgraph's float32 RMSNorm and rotate-half RoPE on the CPU, as MLX primitives (the
// row kernels and their rounding: norm_rope_rows.h).
//
// Why: on the CPU, mx.fast.rms_norm and rotate-half RoPE run as chains of MLX ops (cast,
// square, mean, rsqrt, products; slices, negation, concatenation, products, sum), each a
// pass over memory with its own output buffer, several of them one element at a time on
// x86-64. These read each row once, in vector registers.

#include "norm_rope.h"

#include <atomic>
#include <stdexcept>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"
#include "cpu_eval.h"
#include "norm_rope_rows.h"

namespace mx = mlx::core;

namespace mlxgraph_norm {
namespace {

std::atomic<int> g_level{0};  // index into all_levels()

class RmsNorm : public mx::Primitive {
 public:
  RmsNorm(mx::Stream stream, float eps, bool weight)
      : mx::Primitive(stream), eps_(eps), weight_(weight) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    auto& out = outputs[0];
    auto& encoder = mlxgraph_eval::begin_eval(stream(), inputs, out);
    RmsJob job{x.data<float>(), weight_ ? inputs[1].data<float>() : nullptr,
               out.data<float>(), {x.shape(), x.strides()}, eps_};
    auto fn = all_levels()[g_level.load()].rms;
    if (!weight_ || inputs[1].flags().row_contiguous) {
      encoder.dispatch([job = std::move(job), fn]() { fn(job); });
      return;
    }
    // a view of a weight (strided, broadcast): gathered into a row of its own
    encoder.dispatch([job = std::move(job), fn, ws = inputs[1].strides()]() mutable {
      std::vector<float> w(job.rows.shape.back());
      mlxgraph_eval::gather(job.w, {(int)w.size()}, ws, w.data());
      job.w = w.data();
      fn(job);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxgraph RMSNorm runs on the CPU only");
  }

  const char* name() const override { return "MlxgraphRmsNorm"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RmsNorm&>(other);
    return eps_ == o.eps_ && weight_ == o.weight_;
  }

 private:
  float eps_;
  bool weight_;
};

class Rope : public mx::Primitive {
 public:
  explicit Rope(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    auto& encoder = mlxgraph_eval::begin_eval(stream(), inputs, out);
    const auto &x = inputs[0], &c = inputs[1], &s = inputs[2];
    const auto& shape = out.shape();
    using mlxgraph_eval::broadcast_strides;  // the operands come unbroadcast (rope() below)
    RopeJob job{x.data<float>(), c.data<float>(), s.data<float>(), out.data<float>(),
                {shape, broadcast_strides(x, shape)}, {shape, broadcast_strides(c, shape)},
                {shape, broadcast_strides(s, shape)}};
    auto fn = all_levels()[g_level.load()].rope;
    encoder.dispatch([job = std::move(job), fn]() { fn(job); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxgraph RoPE runs on the CPU only");
  }

  const char* name() const override { return "MlxgraphRope"; }

  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

void refuse(const std::string& what) { throw std::invalid_argument("mlxgraph " + what); }

}  // namespace

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps) {
  if (x.dtype() != mx::float32 || x.ndim() < 1 || x.shape(-1) < 1)
    refuse("RMSNorm: x must be float32 with a nonempty last axis");
  auto s = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs{x};
  if (weight) {
    if (weight->dtype() != mx::float32 || weight->ndim() != 1 || weight->shape(0) != x.shape(-1))
      refuse("RMSNorm: the weight must be float32 [D], D = x's last axis");
    inputs.push_back(*weight);  // a view too: eval_cpu gathers it (no Contiguous node)
  }
  return mx::array(x.shape(), mx::float32, std::make_shared<RmsNorm>(s, eps, weight.has_value()),
                   std::move(inputs));
}

mx::array rope(const mx::array& x, const mx::array& cos, const mx::array& sin) {
  if (x.dtype() != mx::float32 || cos.dtype() != mx::float32 || sin.dtype() != mx::float32 ||
      x.ndim() < 1)
    refuse("RoPE: x, cos and sin must be float32, x at least 1-D");
  auto s = mx::default_stream(mx::Device::cpu);
  // the operands go in as they are, eval_cpu reading each with zero strides where it
  // broadcasts (no Broadcast nodes); raises if they cannot broadcast
  auto shape = mx::broadcast_shapes(mx::broadcast_shapes(x.shape(), cos.shape()), sin.shape());
  if (shape.back() % 2 || x.shape(-1) != shape.back())
    refuse("RoPE: x's last axis must be even and the result's");
  return mx::array(std::move(shape), mx::float32, std::make_shared<Rope>(s), {x, cos, sin});
}

std::vector<std::string> levels() {
  std::vector<std::string> names;
  for (const auto& l : all_levels()) names.push_back(l.name);
  return names;
}

void set_level(const std::string& name) {
  const auto& all = all_levels();
  for (size_t i = 0; i < all.size(); ++i)
    if (name == all[i].name) return g_level.store((int)i);
  refuse("set_level: not a level this CPU runs: " + name);
}

std::string level() { return all_levels()[g_level.load()].name; }

}  // namespace mlxgraph_norm
