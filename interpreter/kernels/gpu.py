"""GPU variants (the "gpu" device plan): the same results as the ops' kernels, built with
less host work per call and fewer device kernels.

On a GPU the host builds each step's graph while the device waits, so what a kernel does
on the host is on the step's critical path (docs/architecture.md, "Device plans"):
- Linear: the product alone; the CPU kernel's checks for the native half-precision
  matrix-vector kernel (a CPU-only path) are left out.
- RmsNorm: MLX's fused kernel where it computes the Llama order (no weight offset, the
  weight in x's dtype), else the op formula; no native-kernel checks.
- Rope and Silu of a decode step (one token): the elementwise formula compiled once per
  shape with ``mx.compile``, which fuses its slices, negation, concatenation, products and
  sum into fewer GPU kernels and is cheaper to call than building each op. Each op keeps
  its dtype, so the result is the op-by-op result (tests/test_device_plan.py checks it bit
  for bit). Steps of several tokens build the ops as the CPU kernel does: one compiled
  entry per prompt length would grow without bound on a server.
"""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register
from mlxgraph.interpreter.kernels.elementwise import _floating
from mlxgraph.interpreter.kernels.fused import rms_norm as _rms_norm_kernel


@register("Linear", device="gpu")
def linear(x, weight, bias=None):
    """x @ weight.T (+ bias): the Linear kernel without the CPU's native-kernel checks."""
    wt = weight.T  # a strided view: the product reads it transposed, nothing is copied
    if bias is None:
        return mx.matmul(x, wt)
    if x.ndim < 2:
        return mx.matmul(x, wt) + bias
    return mx.addmm(bias, x, wt)


@register("RmsNorm", device="gpu")
def rms_norm(x, weight=None, eps=1e-6, weight_offset=0.0):
    """The RmsNorm kernel's result: ``mx.fast.rms_norm`` in the Llama order, else the
    kernel itself (whose native path does not apply off the CPU)."""
    if eps is not None and weight_offset == 0 and weight is not None and weight.dtype == x.dtype:
        return mx.fast.rms_norm(x, weight, eps)
    return _rms_norm_kernel(x, weight, eps, weight_offset)


def _rotate_half_rope(x, cos, sin):
    d = x.shape[-1]
    return x * cos + mx.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1) * sin


def _silu(x):
    return x * mx.sigmoid(x)


_compiled_rope = mx.compile(_rotate_half_rope)
_compiled_silu = mx.compile(_silu)


def _one_token(x) -> bool:
    return x.ndim >= 2 and x.shape[-2] == 1


@register("Rope", device="gpu")
def rope(x, cos, sin):
    """x * cos + rotate_half(x) * sin (the Rope kernel's formula), compiled for one token.

    Raises:
        ValueError: x's last axis is odd.
    """
    if x.shape[-1] % 2:
        raise ValueError(f"Rope: the last axis of x must be even, got {x.shape[-1]}")
    return (_compiled_rope if _one_token(x) else _rotate_half_rope)(x, cos, sin)


@register("Silu", device="gpu")
def silu(x):
    """x * sigmoid(x) (integer input promoted, as the Silu kernel does), compiled for one
    token's rows."""
    x = _floating(x)
    return (_compiled_silu if _one_token(x) else _silu)(x)
