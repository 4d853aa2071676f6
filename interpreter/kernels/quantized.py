"""Kernels of quantized weights (format 1.2): QuantizedLinear and QuantizedEmbedding through
MLX's own quantized ops, which read the packed layout directly on every device, and on the
CPU the native matrix-vector kernel for decode-sized float32 steps when the install built
it (interpreter/quantized_native.py)."""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register
from mlxgraph.interpreter.quantized_native import eligible, native_kernel


@register("QuantizedLinear")
def quantized_linear(x, weight, scales, biases, bias, group_size, bits):
    """x @ W.T (+ bias), W the dequantized [out_features, in_features] weight."""
    native = native_kernel()
    if eligible(native, x, scales, group_size, bits) and mx.default_device() == mx.cpu:
        y = native.fn(x, weight, scales, biases, group_size, bits)
        return y if bias is None else y + bias
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
