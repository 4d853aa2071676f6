"""Creation kernels: arange and full. A missing dtype is inferred as torch does:
int64 when every number is an integer, float32 otherwise (bool for a bool fill)."""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register
from mlxgraph.interpreter.kernels.symbolic import static_int, static_ints


def _host_number(v, op: str, what: str):
    """A host int or float from an Operand (tensors would need an evaluation)."""
    if isinstance(v, (bool, int, float)):
        return v
    return static_int(v, op, what)  # raises the tensor / type error


@register("Arange")
def arange(start=None, end=None, step=None, dtype=None):
    """[start, end) by ``step`` (start defaults to 0, step to 1), torch.arange.

    Raises:
        TypeError: a bound is a tensor. ValueError: end is absent or step is 0.
    """
    if end is None:
        raise ValueError("Arange: end is required")
    start = 0 if start is None else _host_number(start, "Arange", "start")
    end = _host_number(end, "Arange", "end")
    step = 1 if step is None else _host_number(step, "Arange", "step")
    if step == 0:
        raise ValueError("Arange: step must be nonzero")
    fractional = any(isinstance(v, float) and not v.is_integer() for v in (start, end, step))
    if dtype is None:
        dtype = mx.float32 if any(isinstance(v, float) for v in (start, end, step)) else mx.int64
    if fractional and mx.issubdtype(dtype, mx.floating):
        # torch accumulates start + i * step in double: 3 * 0.3 is 0.9f, not 0.90000004f.
        # float64 exists on MLX's CPU stream only; the op is tiny.
        return mx.arange(start, end, step, dtype=mx.float64, stream=mx.cpu).astype(dtype)
    return mx.arange(start, end, step, dtype=dtype)


@register("Full")
def full(shape, value=0, dtype=None):
    """A tensor of ``shape`` filled with ``value``.

    Raises:
        TypeError: a size is a tensor or not an int.
    """
    sizes = static_ints(shape, "Full", "shape")
    if dtype is None:
        dtype = (
            mx.bool_
            if isinstance(value, bool)
            else mx.int64
            if isinstance(value, int)
            else mx.float32
        )
    if dtype == mx.bool_:
        value = bool(value)
    elif not mx.issubdtype(dtype, mx.floating) and float(value).is_integer():
        value = int(value)
    return mx.full(sizes, value, dtype=dtype)
