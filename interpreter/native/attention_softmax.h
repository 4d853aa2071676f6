// mlxgraph's float32 attention softmax on the CPU (attention_softmax.cpp), bound by the
// _activations extension (activations.cpp).
#pragma once

#include <optional>

#include "mlx/array.h"

namespace mlxgraph_softmax {

// softmax over the last axis of float32 scores [B, H, T, S], keys masked out where
// `causal` says (query i sees keys 0 .. S - T + i: lower-right aligned) and where the bool
// `mask` (broadcastable to [B, H, T, S]) is false; `sinks` ([H] float32) adds one logit per
// head to each row's softmax, not to the output. Masked keys get 0; a row with no key and
// no sink, or with a NaN or +inf score, gets NaN. Lazy; raises std::invalid_argument on
// shapes or dtypes that do not fit.
mlx::core::array attention_softmax(const mlx::core::array& scores, bool causal,
                                   const std::optional<mlx::core::array>& mask,
                                   const std::optional<mlx::core::array>& sinks);

}  // namespace mlxgraph_softmax
