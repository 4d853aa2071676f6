"""The native float32 sigmoid, SiLU, attention softmax, RMSNorm and RoPE
(interpreter/native/activations.cpp, attention_softmax.cpp, norm_rope.cpp), if the install
built them: loading, the runtime switch, and the fallback to MLX's own ops.

MLX's x86-64 CPU exp runs one element at a time (~16-20 M elements/s here), so a SiLU of
prefill size costs as much as a large matrix product, and the softmax of a 128-token
attention most of the attention; the native primitives compute exp in vector registers.
MLX's CPU RMSNorm and rotate-half RoPE are chains of ops, a pass over memory each; the
native ones read each row once. They are used for float32 arrays on the CPU where they
compute what the MLX-op code computes (RoPE bitwise; RMSNorm with the same roundings and a
float64 sum of squares); any other dtype, device or layout they do not take, or
``MLXGRAPH_NATIVE_ACTIVATIONS=0``, takes MLX's own ops (``mx.sigmoid``,
``mx.fast.scaled_dot_product_attention`` in interpreter/attention.py, the MLX-op code of
interpreter/kernels/fused.py).
"""

from functools import cache

import mlx.core as mx

from mlxgraph.interpreter.knobs import NATIVE_ACTIVATIONS
from mlxgraph.interpreter.native.mlx_extension import import_mlx_extension


@cache
def native_module():
    """The loaded extension module, or None (not built, switched off by
    ``MLXGRAPH_NATIVE_ACTIVATIONS``, or it fails to load). The switch is read once.

    Raises:
        KnobError: the switch holds a value that is neither on nor off.
    """
    if not NATIVE_ACTIVATIONS.read():
        return None
    return import_mlx_extension("_activations")[0]


def describe() -> str:
    """One line: which sigmoid/SiLU, attention softmax, RMSNorm and RoPE float32 arrays get."""
    module = native_module()
    if module is None:
        return "MLX's sigmoid, softmax, RMSNorm and RoPE ops (native kernels not built, or off)"
    return (f"native sigmoid/SiLU, attention softmax, RMSNorm and RoPE ({module.simd()}) "
            "for float32 on the CPU")


def native_for(*arrays):
    """The extension when it computes on these operands (all float32, CPU stream), else
    None."""
    for a in arrays:  # a loop, not any(): this runs for several nodes of every step
        if not a.dtype == mx.float32:  # (Dtype's == is cheaper than its !=)
            return None
    return native_module() if mx.default_device() == mx.cpu else None


def sigmoid(x):
    """1 / (1 + exp(-x)) of a floating array (native for float32 on the CPU)."""
    native = native_for(x)
    return native.sigmoid(x) if native is not None else mx.sigmoid(x)


def silu(x):
    """x * sigmoid(x) of a floating array (native for float32 on the CPU)."""
    native = native_for(x)
    return native.silu(x) if native is not None else x * mx.sigmoid(x)


_WIDENED_EXACTLY = (mx.float32, mx.float16, mx.bfloat16)  # weights whose float32 copy is exact


def rms_norm(x, weight, eps: float, weight_offset: float):
    """The native RMSNorm of float32 x on the CPU (what the fused kernel computes there:
    x * rsqrt(mean(x^2) + eps) rounded to float32, times the float32 weight + offset), or
    None where it does not apply: another dtype or device, a weight not [D] or not
    float32/float16/bfloat16, an empty x, the switch off."""
    native = native_for(x)
    if native is None or x.ndim == 0 or x.size == 0:
        return None
    if weight is None:  # no weight: the offset plays no part (as in the MLX-op code)
        return native.rms_norm(x, None, eps)
    if weight.dtype not in _WIDENED_EXACTLY or weight.shape != (x.shape[-1],):
        return None
    # torch's and the MLX-op kernel's float32 weight: the widened weight (+ offset, rounded)
    wide = weight.astype(mx.float32)
    return native.rms_norm(x, wide + weight_offset if weight_offset else wide, eps)


def rope(x, cos, sin):
    """The native rotate-half RoPE x * cos + concat(-x2, x1) * sin for float32 operands on
    the CPU (bitwise the MLX ops' result), or None where it does not apply: another dtype
    or device, x's last axis odd or broadcast, shapes that do not broadcast, an empty
    result, the switch off."""
    native = native_for(x, cos, sin)
    xs = x.shape
    if native is None or not xs or xs[-1] % 2:
        return None
    try:
        shape = mx.broadcast_shapes(xs, cos.shape, sin.shape)
    except ValueError:
        return None  # the MLX-op code raises its own error
    if shape[-1] != xs[-1] or 0 in shape:
        return None
    return native.rope(x, cos, sin)


__all__ = ["describe", "native_module", "native_for", "rms_norm", "rope",
           "sigmoid", "silu"]
