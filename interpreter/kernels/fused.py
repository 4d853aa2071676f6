"""Fused kernels: RMS normalization and rotate-half rotary embedding (Hugging Face forms)."""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register
from mlxgraph.interpreter.native import activations as native_activations


@register("RmsNorm")
def rms_norm(x, weight=None, eps=1e-6, weight_offset=0.0):
    """x * rsqrt(mean(x^2, -1) + eps) * (weight + weight_offset), normalized in float32.

    Two Hugging Face conventions differ in where the result returns to x's dtype:
    - weight_offset == 0 (LlamaRMSNorm and its many copies): the normalized float32 value
      is cast to x's dtype, then multiplied by weight (dtypes promote as in torch).
    - weight_offset != 0 (Gemma's ``1 + weight``): the product is taken in float32 and
      the result cast to x's dtype.
    Without a weight the normalized value is returned in x's dtype. In float32 the two
    coincide; float32 x on the CPU runs on the native kernel (interpreter/native/activations.py)
    with the same roundings and a float64 sum of squares.

    Raises:
        ValueError: eps is absent.
    """
    if eps is None:
        raise ValueError("RmsNorm: eps is required")
    native = native_activations.rms_norm(x, weight, eps, weight_offset)
    if native is not None:
        return native
    if weight_offset == 0 and (weight is None or weight.dtype == x.dtype):
        # MLX's fused kernel is the Llama order: float32 normalize, cast, then * weight.
        return mx.fast.rms_norm(x, weight, eps)
    xf = x.astype(mx.float32)
    normed = xf * mx.rsqrt(mx.mean(mx.square(xf), axis=-1, keepdims=True) + eps)
    if weight is None:
        return normed.astype(x.dtype)
    if weight_offset == 0:
        return weight * normed.astype(x.dtype)
    return (normed * (weight.astype(mx.float32) + weight_offset)).astype(x.dtype)


@register("Rope")
def rope(x, cos, sin):
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) over the last axis.

    cos and sin broadcast against x (e.g. [B, 1, T, D] for x [B, H, T, D]), as Hugging
    Face's ``apply_rotary_pos_emb`` applies them to one tensor. float32 operands on the
    CPU run on the native kernel (bitwise the same result; interpreter/native/activations.py).

    Raises:
        ValueError: x's last axis is odd.
    """
    native = native_activations.rope(x, cos, sin)
    if native is not None:
        return native
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"Rope: the last axis of x must be even, got {d}")
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + mx.concatenate([-x2, x1], axis=-1) * sin


@register("LayerNorm")
def layer_norm(x, weight=None, bias=None, eps=None):
    """(x - mean) * rsqrt(var + eps) * weight + bias over the last axis, in x's dtype.

    MLX's fused kernel accumulates in float32 for half-precision x, as torch does on CPU.

    Raises:
        ValueError: eps is absent.
    """
    if eps is None:
        raise ValueError("LayerNorm: eps is required")
    return mx.fast.layer_norm(x, weight, bias, eps)
