// mlxgraph's float32 RMSNorm and rotate-half RoPE on the CPU (norm_rope.cpp), bound by the
// _activations extension (activations.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mlx/array.h"

namespace mlxgraph_norm {

// x * rsqrt(mean(x^2, -1) + eps) over the last axis of float32 x, rounded to float32, then
// times `weight` (float32 [D]) rounded again (Hugging Face's Llama order). The sum of squares
// is exact-square float64; past FLT_MAX it counts as +inf, as a float32 sum overflows. Lazy;
// raises std::invalid_argument on shapes or dtypes that do not fit.
mlx::core::array rms_norm(const mlx::core::array& x,
                          const std::optional<mlx::core::array>& weight, float eps);

// x * cos + concat(-x2, x1) * sin, x = concat(x1, x2) on the last axis, for float32 x, cos
// and sin broadcast together (the result has the broadcast shape): each product rounded
// to float32, then their sum, as MLX's own ops round them. Lazy; raises
// std::invalid_argument on shapes or dtypes that do not fit.
mlx::core::array rope(const mlx::core::array& x, const mlx::core::array& cos,
                      const mlx::core::array& sin);

// The instruction-set levels of these two kernels this CPU runs, best (the default) first;
// tests and benchmarks pick one with set_level (std::invalid_argument for others).
std::vector<std::string> levels();
void set_level(const std::string& name);
std::string level();

}  // namespace mlxgraph_norm
