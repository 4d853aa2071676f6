"""Elementwise kernels: unary math, binary arithmetic, comparisons, logic and where.

Semantics are torch's. Operand inputs (``a``, ``b``) arrive as mx.array, Python int (a
value slot) or Python bool/int/float literal, and are handed to MLX as they are so a
literal stays weak (a float16 tensor times 2.0 stays float16), as in torch.
"""

import math

import mlx.core as mx

from mlxgraph.interpreter.kernels import register
from mlxgraph.interpreter.native import activations as native_activations
from mlxgraph.schema.enums import RoundingMode
from mlxgraph.schema.op_catalogue import Trait, ops_with


def _is_float(v) -> bool:
    """True for a floating array or a Python float literal."""
    if isinstance(v, mx.array):
        return mx.issubdtype(v.dtype, mx.floating)
    return isinstance(v, float)


def _floating(x: mx.array) -> mx.array:
    """x as a float array: torch computes float math on integer or bool input in float32."""
    return x if mx.issubdtype(x.dtype, mx.floating) else x.astype(mx.float32)


# ---------------------------------------------------------------- unary


def _register_float_unary(op: str, fn) -> None:
    """Register a unary float-math kernel ``op(x) = fn(x)`` (integer input promoted)."""

    def kernel(x):
        return fn(_floating(x))

    kernel.__name__ = kernel.__qualname__ = op.lower()
    kernel.__doc__ = f"{op}(x), torch semantics; integer input computes in float32."
    register(op)(kernel)


# The catalogue names the MLX function of each generic unary op (schema/op_catalogue.py).
for _op in ops_with(Trait.UNARY):
    if _op.mlx is not None:
        _register_float_unary(_op.name, getattr(mx, _op.mlx))
_register_float_unary("Sigmoid", native_activations.sigmoid)


@register("Neg")
def neg(x):
    """-x."""
    return mx.negative(x)


@register("Abs")
def abs_(x):
    """|x| (keeps integer dtypes)."""
    return mx.abs(x)


@register("LogicalNot")
def logical_not(x):
    """not x, as bool (nonzero is true)."""
    return mx.logical_not(x)


@register("Silu")
def silu(x):
    """x * sigmoid(x) (native for float32 on the CPU: interpreter/native/activations.py)."""
    return native_activations.silu(_floating(x))


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@register("Gelu")
def gelu(x, approximate=False):
    """GELU: exact erf form, or torch's tanh approximation when ``approximate``."""
    x = _floating(x)
    if approximate:
        return 0.5 * x * (1.0 + mx.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))))
    return 0.5 * x * (1.0 + mx.erf(x * _SQRT1_2))


def _bound(x: mx.array, v):
    # An integral bound on an integer tensor stays an int so the clamp keeps x's dtype
    # (the schema stores bounds as doubles).
    if v is not None and not mx.issubdtype(x.dtype, mx.floating) and float(v).is_integer():
        return int(v)
    return v


@register("Clamp")
def clamp(x, min=None, max=None):  # noqa: A002 - schema field names
    """Clamp x to [min, max]; either bound may be absent (None)."""
    if min is None and max is None:
        return x
    return mx.clip(x, _bound(x, min), _bound(x, max))


# ---------------------------------------------------------------- binary arithmetic


@register("Add")
def add(a, b):
    """a + b, broadcasting."""
    return mx.add(a, b)


@register("Sub")
def sub(a, b):
    """a - b, broadcasting."""
    return mx.subtract(a, b)


@register("Mul")
def mul(a, b):
    """a * b, broadcasting."""
    return mx.multiply(a, b)


def _half_result(a, b):
    """float16 or bfloat16 when ``a op b`` has that dtype (weak literals keep it), else None."""
    arrays = [v for v in (a, b) if isinstance(v, mx.array)]
    dtype = mx.result_type(*arrays) if arrays else None
    return dtype if dtype in (mx.float16, mx.bfloat16) else None


def _f32(v):
    """A half-precision array as float32; other arrays and Python numbers as they are."""
    return (
        v.astype(mx.float32)
        if isinstance(v, mx.array) and v.dtype in (mx.float16, mx.bfloat16)
        else v
    )


_ROUNDING = {
    None: None, RoundingMode.none: None, RoundingMode.trunc: "trunc", RoundingMode.floor: "floor",
    "none": None, "trunc": "trunc", "floor": "floor",
}


@register("Div")
def div(a, b, rounding=RoundingMode.none):
    """a / b: true division (integers give float32), or rounded like torch.div.

    Args:
        rounding: RoundingMode code or name: none, trunc (toward zero), floor.

    Raises:
        ValueError: unknown rounding mode.
    """
    if rounding not in _ROUNDING:
        raise ValueError(f"Div: unknown rounding mode {rounding!r}")
    mode = _ROUNDING[rounding]
    if mode is None:
        return mx.divide(a, b)
    if mode == "floor":
        half = _half_result(a, b)
        if half is None:
            return mx.floor_divide(a, b)
        # torch floors half floats' quotient in float32: one just below an integer must not
        # round up to it in half precision first. (Its trunc rounds first, as MLX does.)
        return mx.floor_divide(_f32(a), _f32(b)).astype(half)
    if _is_float(a) or _is_float(b):
        return mx.trunc(mx.divide(a, b))
    # Integer truncation: floor, plus one where the division is inexact and the signs differ.
    q = mx.floor_divide(a, b)
    inexact = mx.not_equal(mx.remainder(a, b), 0)
    signs_differ = mx.not_equal(mx.less(a, 0), mx.less(b, 0))
    return mx.where(mx.logical_and(inexact, signs_differ), q + 1, q)


@register("Pow")
def pow_(a, b):
    """a ** b (either may be a scalar)."""
    return mx.power(a, b)


@register("Maximum")
def maximum(a, b):
    """Elementwise max; NaN propagates as in torch."""
    return mx.maximum(a, b)


@register("Minimum")
def minimum(a, b):
    """Elementwise min; NaN propagates as in torch."""
    return mx.minimum(a, b)


@register("Remainder")
def remainder(a, b):
    """a mod b with the sign of the divisor (torch.remainder, Python %)."""
    return mx.remainder(a, b)


# ---------------------------------------------------------------- comparisons and logic


def _register_binary(op: str, fn, what: str) -> None:
    """Register a binary kernel ``op(a, b) = fn(a, b)`` giving a bool array."""

    def kernel(a, b):
        return fn(a, b)

    kernel.__name__ = kernel.__qualname__ = op.lower()
    kernel.__doc__ = f"{what} as a bool array, broadcasting."
    register(op)(kernel)


for _op, _fn, _what in (
    ("Equal", mx.equal, "a == b"),
    ("NotEqual", mx.not_equal, "a != b"),
    ("Less", mx.less, "a < b"),
    ("LessEqual", mx.less_equal, "a <= b"),
    ("Greater", mx.greater, "a > b"),
    ("GreaterEqual", mx.greater_equal, "a >= b"),
    ("LogicalAnd", mx.logical_and, "a and b (nonzero is true)"),
    ("LogicalOr", mx.logical_or, "a or b (nonzero is true)"),
):
    _register_binary(_op, _fn, _what)


@register("Where")
def where(cond, a, b):
    """a where cond else b, broadcasting; a non-bool cond counts nonzero as true."""
    if cond.dtype != mx.bool_:
        cond = cond.astype(mx.bool_)
    return mx.where(cond, a, b)
