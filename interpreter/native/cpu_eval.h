// The start of eval_cpu, and the reading of views, that mlxgraph's MLX primitives share
// (activations.cpp, attention_softmax.cpp, norm_rope.cpp, quantized_matvec.cpp,
// half_matvec.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlxgraph_eval {

// Allocates out and registers the inputs and out with the stream's command encoder (it
// keeps them alive until the dispatched task has run); returns the encoder to dispatch on.
inline mlx::core::cpu::CommandEncoder& begin_eval(mlx::core::Stream stream,
                                                  const std::vector<mlx::core::array>& inputs,
                                                  mlx::core::array& out) {
  out.set_data(mlx::core::allocator::malloc(out.nbytes()));
  auto& encoder = mlx::core::cpu::get_command_encoder(stream);
  for (const auto& in : inputs) encoder.set_input_array(in);
  encoder.set_output_array(out);
  return encoder;
}

// The strides of `a` seen as broadcast to `shape` (0 along the axes it broadcasts on): what
// an mx::broadcast_to view would have, without its graph node.
inline mlx::core::Strides broadcast_strides(const mlx::core::array& a,
                                            const mlx::core::Shape& shape) {
  mlx::core::Strides strides(shape.size(), 0);
  const size_t lead = shape.size() - a.ndim();
  for (size_t d = 0; d < (size_t)a.ndim(); ++d)
    if (a.shape(d) != 1) strides[lead + d] = a.strides()[d];
  return strides;
}

// The elements of a view of ``shape`` and ``strides`` (in elements; 0 where it broadcasts)
// from ``src``, in row-major order into ``dst``: what mx::contiguous would copy, read in the
// same order, but inside the dispatched task, so that no Contiguous node is built (MLX
// schedules each graph node for ~1.2 us of host time per step).
template <class T>
inline void gather(const T* src, const mlx::core::Shape& shape,
                   const mlx::core::Strides& strides, T* dst) {
  const int nd = (int)shape.size();
  size_t total = 1;
  for (int d = 0; d < nd; ++d) total *= shape[d];
  std::vector<int64_t> index(nd, 0);
  int64_t at = 0;
  for (size_t i = 0; i < total; ++i) {
    dst[i] = src[at];
    for (int d = nd - 1; d >= 0; --d) {  // the next index, carried like an odometer
      at += strides[d];
      if (++index[d] < shape[d]) break;
      at -= strides[d] * shape[d];
      index[d] = 0;
    }
  }
}

}  // namespace mlxgraph_eval
