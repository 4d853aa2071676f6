"""Kernels of quantized weights (format 1.2): QuantizedLinear and QuantizedEmbedding through
MLX's own quantized ops, which read the packed layout directly on every device."""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register


@register("QuantizedLinear")
def quantized_linear(x, weight, scales, biases, bias, group_size, bits):
    """x @ W.T (+ bias), W the dequantized [out_features, in_features] weight."""
    y = mx.quantized_matmul(x, weight, scales, biases, transpose=True, group_size=group_size,
                            bits=bits)
    return y if bias is None else y + bias


@register("QuantizedEmbedding")
def quantized_embedding(weight, scales, biases, indices, group_size, bits):
    """The rows of W at ``indices``, dequantized: shape indices.shape + [in_features]."""
    flat = indices.reshape(-1)
    rows = mx.dequantize(mx.take(weight, flat, axis=0), mx.take(scales, flat, axis=0),
                         mx.take(biases, flat, axis=0), group_size=group_size, bits=bits)
    return rows.reshape(*indices.shape, rows.shape[-1])
