// The start of eval_cpu that mlxgraph's MLX primitives share (activations.cpp,
// attention_softmax.cpp, norm_rope.cpp, quantized_matvec.cpp, half_matvec.h).
#pragma once

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

}  // namespace mlxgraph_eval
