// mlxgraph's quantized matrix-vector product on the CPU, as an MLX primitive
// (docs/architecture.md#quantized-weights), and the module of the native kernels (the half
// precision one is half_matvec.h, the quantized prefill product quantized_tile.h, the
// dequantize dequantize.h). Built at install by setup.py (optional);
// interpreter/native/quantized.py loads it and falls back to MLX's own ops without it.
//
// The arithmetic is quantized_kernel.h's (16-byte blocks of codes widened in registers,
// AVX-512 / AVX2 / generic code picked at load, rows of W over matvec_common.h's pool);
// this file is the MLX side: the primitives, their checks, and the Python module.

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "cpu_eval.h"
#include "dequantize.h"
#include "half_matvec.h"
#include "int8_kernel.h"
#include "matvec_common.h"
#include "quantized_kernel.h"
#include "quantized_tile.h"
#include "simd_name.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

using namespace mlxgraph_native;

// What the packed-weight primitives share: the format's group size and bits (two nodes with
// equal ones are the same computation), and the CPU only.
class PackedWeightPrimitive : public mx::Primitive {
 public:
  PackedWeightPrimitive(mx::Stream stream, int group_size, int bits)
      : mx::Primitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(std::string("mlxgraph ") + name() + " runs on the CPU only");
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const PackedWeightPrimitive&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }

 protected:
  int group_size_, bits_;
};

// The packed weight's pointers and shape as the kernels read them (inputs of an eval_cpu,
// checked at the node's creation by check_packed).
PackedWeight packed_weight(const mx::array& w, const mx::array& scales,
                                  const mx::array& biases, int k, int group_size, int bits) {
  return PackedWeight{w.data<uint8_t>(), scales.data<void>(), biases.data<void>(),
                      (int)w.shape(0), k, bits, group_size, scales.dtype() == mx::float16};
}

// A product of x by a packed weight through KERNEL on its problem P (QuantizedProblem,
// Int8Problem: the same leading fields). A view of x (the matvec's: at most 8 rows; the
// int8 product's x is made row-major at its creation) is gathered into rows on the stream's
// thread.
template <class P, void (*KERNEL)(P&)>
class PackedProduct : public PackedWeightPrimitive {
 public:
  using PackedWeightPrimitive::PackedWeightPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    const auto& scales = inputs[2];
    auto& out = outputs[0];
    auto& encoder = mlxgraph_eval::begin_eval(stream(), inputs, out);
    P p{x.data<float>(), w.data<uint8_t>(), scales.data<void>(), inputs[3].data<void>(),
        out.data<float>(), (int)(x.size() / x.shape(-1)), (int)w.shape(0), (int)x.shape(-1),
        bits_, group_size_, scales.dtype() == mx::float16};
    if (x.flags().row_contiguous) {
      encoder.dispatch([p]() mutable { KERNEL(p); });
    } else {
      encoder.dispatch([p, shape = x.shape(), strides = x.strides()]() mutable {
        thread_local std::vector<float> rows;
        rows.resize((size_t)p.m * p.k);
        gather(p.x, shape, strides, rows.data());
        p.x = rows.data();
        KERNEL(p);
      });
    }
  }
};

class QuantizedMatvec : public PackedProduct<QuantizedProblem, quantized_product> {
 public:
  using PackedProduct::PackedProduct;
  const char* name() const override { return "MlxgraphQuantizedMatvec"; }
};

// The same product with x rounded to int8 per block of 32 (int8_kernel.h), any rows.
class QuantizedInt8Product : public PackedProduct<Int8Problem, int8_product> {
 public:
  using PackedProduct::PackedProduct;
  const char* name() const override { return "MlxgraphQuantizedInt8Product"; }
};

// The float32 weight of a packed one (dequantize.h), for prefill-sized steps.
class QuantizedDequantize : public PackedWeightPrimitive {
 public:
  using PackedWeightPrimitive::PackedWeightPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& w = inputs[0];
    const auto& scales = inputs[1];
    const auto& biases = inputs[2];
    auto& out = outputs[0];
    auto& encoder = mlxgraph_eval::begin_eval(stream(), inputs, out);
    DequantizeProblem p{packed_weight(w, scales, biases, (int)out.shape(1), group_size_, bits_),
                        out.data<float>()};
    encoder.dispatch([p]() { dequantize(p); });
  }

  const char* name() const override { return "MlxgraphQuantizedDequantize"; }
};

// x @ W.T for prefill-sized float32 x, W dequantized a tile at a time (quantized_tile.h).
class QuantizedTile : public PackedWeightPrimitive {
 public:
  using PackedWeightPrimitive::PackedWeightPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    auto& out = outputs[0];
    auto& encoder = mlxgraph_eval::begin_eval(stream(), inputs, out);
    QuantizedTileProblem p{x.data<float>(),
                           packed_weight(inputs[1], inputs[2], inputs[3], (int)x.shape(-1),
                                         group_size_, bits_),
                           out.data<float>(), (int)(x.size() / x.shape(-1))};
    if (x.flags().row_contiguous) {
      encoder.dispatch([p]() { quantized_tile_product(p); });
    } else {  // a view: its elements gathered into rows on the stream's thread
      encoder.dispatch([p, shape = x.shape(), strides = x.strides()]() mutable {
        std::vector<float> rows((size_t)p.m * p.w.k);
        gather(p.x, shape, strides, rows.data());
        p.x = rows.data();
        quantized_tile_product(p);
      });
    }
  }

  const char* name() const override { return "MlxgraphQuantizedTile"; }
};

// Shapes and dtypes both native entry points need: bits 4 or 8, whole 16-byte blocks per
// group, uint32 w [N, K * bits / 32], scales/biases [N, K / group_size] of one float dtype.
void check_packed(const char* what, const mx::array& w, const mx::array& scales,
                  const mx::array& biases, int k, int group_size, int bits) {
  const std::string name(what);
  if ((bits != 4 && bits != 8) || group_size <= 0 || group_size * bits / 8 % BLOCK != 0)
    throw std::invalid_argument(name + ": unsupported bits or group size");
  if (w.dtype() != mx::uint32 || w.ndim() != 2 ||
      (scales.dtype() != mx::float32 && scales.dtype() != mx::float16) ||
      biases.dtype() != scales.dtype() || scales.ndim() != 2)
    throw std::invalid_argument(name + ": uint32 w, float32 or float16 scales and biases");
  if ((long)w.shape(1) * 32 / bits != k || k % group_size != 0 ||
      scales.shape(0) != w.shape(0) || scales.shape(1) != k / group_size ||
      biases.shape() != scales.shape())
    throw std::invalid_argument(name + ": shapes do not match");
}

mx::array quantized_dequantize(const mx::array& w, const mx::array& scales,
                               const mx::array& biases, int group_size, int bits) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("dequantize: unsupported bits");
  const int k = w.ndim() == 2 ? (int)((long)w.shape(1) * 32 / bits) : 0;
  check_packed("dequantize", w, scales, biases, k, group_size, bits);
  auto s = mx::default_stream(mx::Device::cpu);
  return mx::array({w.shape(0), k}, mx::float32,
                   std::make_shared<QuantizedDequantize>(s, group_size, bits),
                   {row_major(w, s), row_major(scales, s), row_major(biases, s)});
}

// The checks the tiled product relies on: float32 x of any rows, AVX-512F.
mx::array quantized_tile(const mx::array& x, const mx::array& w, const mx::array& scales,
                         const mx::array& biases, int group_size, int bits) {
  if (!quantized_tile_available())
    throw std::invalid_argument("quantized_tile: needs x86-64 with AVX-512F");
  if (x.dtype() != mx::float32 || x.ndim() < 1)
    throw std::invalid_argument("quantized_tile: float32 x");
  const int k = x.shape(-1);
  check_packed("quantized_tile", w, scales, biases, k, group_size, bits);
  if (k == 0) throw std::invalid_argument("quantized_tile: shapes do not match");
  auto s = mx::default_stream(mx::Device::cpu);
  auto shape = x.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<QuantizedTile>(s, group_size, bits),
                   {x, row_major(w, s), row_major(scales, s), row_major(biases, s)});
}

// The checks the kernel relies on; the Python side only calls it for eligible shapes.
mx::array quantized_matvec(const mx::array& x_in, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int group_size, int bits) {
  if (x_in.dtype() != mx::float32 || x_in.ndim() < 1)
    throw std::invalid_argument("quantized_matvec: float32 x");
  const int k = x_in.shape(-1);
  check_packed("quantized_matvec", w, scales, biases, k, group_size, bits);
  if (k == 0 || x_in.size() / k > MAX_ROWS)
    throw std::invalid_argument("quantized_matvec: shapes do not match");
  auto s = mx::default_stream(mx::Device::cpu);
  auto shape = x_in.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<QuantizedMatvec>(s, group_size, bits),
                   {x_in, row_major(w, s), row_major(scales, s), row_major(biases, s)});
}

// x @ dequantize(w).T with x rounded to int8 per block of 32: float32 x of any rows, group
// sizes of whole x blocks.
mx::array quantized_int8(const mx::array& x_in, const mx::array& w, const mx::array& scales,
                         const mx::array& biases, int group_size, int bits) {
  if (x_in.dtype() != mx::float32 || x_in.ndim() < 1)
    throw std::invalid_argument("quantized_int8: float32 x");
  const int k = x_in.shape(-1);
  check_packed("quantized_int8", w, scales, biases, k, group_size, bits);
  if (k == 0 || group_size % XBLOCK != 0)
    throw std::invalid_argument("quantized_int8: a group size of whole 32-value blocks");
  auto s = mx::default_stream(mx::Device::cpu);
  auto shape = x_in.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<QuantizedInt8Product>(s, group_size, bits),
                   {row_major(x_in, s), row_major(w, s), row_major(scales, s),
                    row_major(biases, s)});
}

}  // namespace

NB_MODULE(_quantized_matvec, m) {
  nb::module_::import_("mlx.core");  // registers mlx.core.array with nanobind first
  m.def("quantized_matvec", &quantized_matvec, nb::arg("x"), nb::arg("w"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("group_size"), nb::arg("bits"),
        "x @ dequantize(w).T for float32 x of at most 8 rows (lazy MLX array).");
  m.def("quantized_int8", &quantized_int8, nb::arg("x"), nb::arg("w"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("group_size"), nb::arg("bits"),
        "x @ dequantize(w).T with x rounded to int8 per 32 values (lazy MLX array).");
  m.def("int8_levels", [] {
    std::vector<std::string> names;
    for (const auto& level : int8_levels()) names.push_back(level.name);
    return names;
  }, "The int8 kernel's instruction-set levels this CPU runs, best (the default) first.");
  m.def("set_int8_level", [](const std::string& name) {
    for (size_t i = 0; i < int8_levels().size(); ++i)
      if (name == int8_levels()[i].name) return g_int8_level.store((int)i);
    throw std::invalid_argument("set_int8_level: not a level this CPU runs: " + name);
  }, nb::arg("name"), "Run the int8 kernel's code for ``name`` (tests, benchmarks).");
  m.def("int8_level", [] { return std::string(int8_levels()[g_int8_level.load()].name); });
  m.def("dequantize", &quantized_dequantize, nb::arg("w"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("group_size"), nb::arg("bits"),
        "The float32 [N, K] weight of a packed one, scale * code + bias (lazy MLX array).");
  m.def("quantized_tile", &quantized_tile, nb::arg("x"), nb::arg("w"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("group_size"), nb::arg("bits"),
        "x @ dequantize(w).T for float32 x of any rows, w dequantized a tile at a time "
        "(AVX-512F; lazy MLX array).");
  m.def("tile_available", &quantized_tile_available,
        "Whether this CPU runs quantized_tile (x86-64 with AVX-512F).");
  m.def("half_matvec", &half_matvec, nb::arg("x"), nb::arg("w"),
        "x @ w.T in float32 for float16 or bfloat16 x of at most 8 rows and w of x's dtype.");
  m.def("simd", &simd_name, "The instruction set the kernel's dispatch picks on this CPU.");
  m.def("levels", [] {
    std::vector<std::string> names;
    for (const auto& level : levels()) names.push_back(level.name);
    return names;
  }, "The quantized kernel's instruction-set levels this CPU runs, best (the default) first.");
  m.def("set_level", [](const std::string& name) {
    for (size_t i = 0; i < levels().size(); ++i)
      if (name == levels()[i].name) return g_level.store((int)i);
    throw std::invalid_argument("set_level: not a level this CPU runs: " + name);
  }, nb::arg("name"), "Run the quantized kernel's code for ``name`` (tests, benchmarks).");
  m.def("level", [] { return std::string(levels()[g_level.load()].name); });
  m.def("set_threads", [](int n) { g_threads = std::clamp(n, 1, POOL_MAX_THREADS); },
        nb::arg("threads"));
  m.def("threads", [] { return g_threads.load(); });
  m.attr("MAX_ROWS") = MAX_ROWS;
}
