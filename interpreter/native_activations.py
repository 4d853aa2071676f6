"""The native float32 sigmoid, SiLU and attention softmax (interpreter/native/activations.cpp,
attention_softmax.cpp), if the install built them: loading, the runtime switch, and the
fallback to MLX's own ops.

MLX's x86-64 CPU exp runs one element at a time (~16-20 M elements/s here), so a SiLU of
prefill size costs as much as a large matrix product, and the softmax of a 128-token
attention most of the attention; the native primitives compute exp in vector registers.
They are used for float32 arrays on the CPU; any other dtype or device, or
``MLXGRAPH_NATIVE_ACTIVATIONS=0``, takes MLX's own ops (``mx.sigmoid``, and
``mx.fast.scaled_dot_product_attention`` in interpreter/attention.py).
"""

import os
from functools import cache

import mlx.core as mx

from mlxgraph.interpreter.mlx_extension import import_mlx_extension

SWITCH_ENV = "MLXGRAPH_NATIVE_ACTIVATIONS"  # 0/off: MLX's own sigmoid and softmax everywhere
_OFF = ("0", "off", "no", "false", "mlx")


@cache
def native_module():
    """The loaded extension module, or None (not built, switched off, or it fails to load)."""
    if os.environ.get(SWITCH_ENV, "1").strip().lower() in _OFF:
        return None
    return import_mlx_extension("_activations")[0]


def describe() -> str:
    """One line: which sigmoid/SiLU and attention softmax float32 arrays get."""
    module = native_module()
    if module is None:
        return "MLX's sigmoid and softmax (native kernels not built, or off)"
    return f"native sigmoid/SiLU and attention softmax ({module.simd()}) for float32 on the CPU"


def native_for(*arrays):
    """The extension when it computes on these operands (all float32, CPU stream), else
    None."""
    if any(a.dtype != mx.float32 for a in arrays) or mx.default_device() != mx.cpu:
        return None
    return native_module()


def sigmoid(x):
    """1 / (1 + exp(-x)) of a floating array (native for float32 on the CPU)."""
    native = native_for(x)
    return native.sigmoid(x) if native is not None else mx.sigmoid(x)


def silu(x):
    """x * sigmoid(x) of a floating array (native for float32 on the CPU)."""
    native = native_for(x)
    return native.silu(x) if native is not None else x * mx.sigmoid(x)


__all__ = ["SWITCH_ENV", "describe", "native_module", "native_for", "sigmoid", "silu"]
