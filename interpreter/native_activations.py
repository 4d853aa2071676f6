"""The native float32 sigmoid and SiLU (interpreter/native/activations.cpp), if the install
built them: loading, the runtime switch, and the fallback to MLX's own ops.

MLX's x86-64 CPU exp runs one element at a time (~16-20 M elements/s here), so a SiLU of
prefill size costs as much as a large matrix product; the native primitive computes it in
vector registers. It is used for float32 arrays on the CPU; any other dtype or device, or
``MLXGRAPH_NATIVE_ACTIVATIONS=0``, takes MLX's ``mx.sigmoid``.
"""

import os
from functools import cache

import mlx.core as mx

from mlxgraph.interpreter.mlx_extension import import_mlx_extension

SWITCH_ENV = "MLXGRAPH_NATIVE_ACTIVATIONS"  # 0/off: MLX's own sigmoid everywhere
_OFF = ("0", "off", "no", "false", "mlx")


@cache
def native_module():
    """The loaded extension module, or None (not built, switched off, or it fails to load)."""
    if os.environ.get(SWITCH_ENV, "1").strip().lower() in _OFF:
        return None
    return import_mlx_extension("_activations")[0]


def describe() -> str:
    """One line: which sigmoid/SiLU float32 arrays get."""
    module = native_module()
    if module is None:
        return "MLX's sigmoid (native kernel not built, or off)"
    return f"native sigmoid/SiLU ({module.simd()}) for float32 on the CPU"


def _native_for(x):
    """The extension when it computes ``x`` (float32, CPU stream), else None."""
    if x.dtype != mx.float32 or mx.default_device() != mx.cpu:
        return None
    return native_module()


def sigmoid(x):
    """1 / (1 + exp(-x)) of a floating array (native for float32 on the CPU)."""
    native = _native_for(x)
    return native.sigmoid(x) if native is not None else mx.sigmoid(x)


def silu(x):
    """x * sigmoid(x) of a floating array (native for float32 on the CPU)."""
    native = _native_for(x)
    return native.silu(x) if native is not None else x * mx.sigmoid(x)


__all__ = ["SWITCH_ENV", "describe", "native_module", "sigmoid", "silu"]
