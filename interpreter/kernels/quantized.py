"""Kernels of quantized weights (format 1.2): QuantizedLinear and QuantizedEmbedding through
MLX's own quantized ops, which read the packed layout directly on every device, and on the
CPU the native matrix-vector kernel for decode-sized float32 steps when the install built
it, and for longer ones its tiled product (the weight dequantized a tile at a time), or a
dequantized weight under the BLAS matmul (interpreter/native/quantized.py).

Scales and biases narrower than float32 (a float32 graph stores them as float16 by
default) are widened before dequantizing: the weight is then computed in float32, which is
also what ``mx.quantized_matmul`` computes for a float32 x, and the session casts an
output to its declared dtype."""

import mlx.core as mx

from mlxgraph.interpreter.dequantize import dequantize
from mlxgraph.interpreter.kernels import register
from mlxgraph.interpreter.native.quantized import (
    dequantize_eligible,
    eligible,
    int8_eligible,
    native_kernel,
    prefill_sized,
    tile_eligible,
)


def _widened(scales, biases) -> tuple:
    """Scales and biases as float32 when they are a narrower float."""
    if scales.dtype == mx.float32:
        return scales, biases
    return scales.astype(mx.float32), biases.astype(mx.float32)


@register("QuantizedLinear")
def quantized_linear(x, weight, scales, biases, bias, group_size, bits):
    """x @ W.T (+ bias), W the dequantized [out_features, in_features] weight."""
    native = native_kernel()
    on_cpu = mx.default_device() == mx.cpu
    if on_cpu and eligible(native, x, scales, group_size, bits):
        y = native.fn(x, weight, scales, biases, group_size, bits)
    elif on_cpu and tile_eligible(native, x, scales, group_size, bits):
        # Prefill: the packed weight dequantized a tile at a time into cache, never whole.
        y = native.tile_fn(x, weight, scales, biases, group_size, bits)
    elif on_cpu and prefill_sized(x):
        # MLX's CPU quantized_matmul is a plain loop (~20x a float32 matmul at 128 rows):
        # a prefill-sized step dequantizes the weight and takes the BLAS matmul instead,
        # natively when it can (MLX's CPU dequantize costs more than the product itself).
        if dequantize_eligible(native, scales, group_size, bits):
            w = native.dequantize_fn(weight, scales, biases, group_size, bits)
        else:
            w = mx.dequantize(weight, *_widened(scales, biases), group_size=group_size,
                              bits=bits)
        y = mx.matmul(x, w.T)
    else:
        y = mx.quantized_matmul(x, weight, scales, biases, transpose=True,
                                group_size=group_size, bits=bits)
    return y if bias is None else y + bias


@register("QuantizedLinear", variant="int8")
def quantized_linear_int8(x, weight, scales, biases, bias, group_size, bits):
    """x @ W.T (+ bias) with x rounded to int8 per 32 values (Program.load's
    int8_activations; docs/precision.md), where the int8 kernel takes the shape; exact
    otherwise."""
    native = native_kernel()
    if mx.default_device() == mx.cpu and int8_eligible(native, x, scales, group_size, bits):
        y = native.int8_fn(x, weight, scales, biases, group_size, bits)
        return y if bias is None else y + bias
    return quantized_linear(x, weight, scales, biases, bias, group_size, bits)


@register("QuantizedEmbedding")
def quantized_embedding(weight, scales, biases, indices, group_size, bits):
    """The rows of W at ``indices``, dequantized: shape indices.shape + [in_features]."""
    flat = indices.reshape(-1)
    picked = (mx.take(a, flat, axis=0) for a in (scales, biases))
    rows = dequantize(mx.take(weight, flat, axis=0), *_widened(*picked), group_size, bits)
    return rows.reshape(*indices.shape, rows.shape[-1])
