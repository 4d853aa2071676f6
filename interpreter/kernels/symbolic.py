"""Runtime-integer kernels (SymSize, SymArith) and the host-int helper shared by shape ops.

Value slots hold Python ints, known on the host, so shape arithmetic never evaluates a
tensor. Division and modulo follow Python (floor) semantics, as torch's symbolic ints do.
"""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register
from mlxgraph.schema.enums import SymOp


def static_int(v, op: str, what: str) -> int:
    """A host integer from an Operand input (value-slot int or integer literal).

    Raises:
        TypeError: v is a tensor (its value would need an evaluation) or not an integer.
    """
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, mx.array):
        raise TypeError(f"{op}: {what} must be a host int (value slot or literal), got a tensor; "
                        "reading it would force an evaluation")
    raise TypeError(f"{op}: {what} must be an int, got {v!r}")


_INT_ONLY = {int}


def static_ints(values, op: str, field: str) -> list:
    """Host integers from a list Operand (a shape): ``static_int`` of each entry, named
    ``field[i]`` in an error. Plain ints, the common case on every step, pass unchecked."""
    if set(map(type, values)) <= _INT_ONLY:  # (a generator under all() costs twice this)
        return list(values)
    return [static_int(v, op, f"{field}[{i}]") for i, v in enumerate(values)]


@register("SymSize")
def sym_size(x, axis) -> int:
    """x.shape[axis] as a Python int (negative axes count from the end)."""
    return int(x.shape[axis])


_SYM_OPS = {
    SymOp.add: lambda a, b: a + b,
    SymOp.sub: lambda a, b: a - b,
    SymOp.mul: lambda a, b: a * b,
    SymOp.floordiv: lambda a, b: a // b,
    SymOp.mod: lambda a, b: a % b,
    SymOp.min: min,
    SymOp.max: max,
    SymOp.neg: lambda a, b: -a,
}
_SYM_NAMES = {name: code for name, code in vars(SymOp).items() if not name.startswith("_")}


@register("SymArith")
def sym_arith(a, b=None, op=SymOp.add) -> int:
    """``a op b`` on host ints (``neg`` ignores b); floordiv and mod round toward -inf.

    Args:
        op: SymOp code or name (add, sub, mul, floordiv, mod, min, max, neg).

    Raises:
        ValueError: unknown op. TypeError: an operand is a tensor.
        ZeroDivisionError: floordiv or mod by zero.
    """
    code = _SYM_NAMES.get(op, op)
    if code not in _SYM_OPS:
        raise ValueError(f"SymArith: unknown op {op!r}")
    a = static_int(a, "SymArith", "a")
    b = None if code == SymOp.neg else static_int(b, "SymArith", "b")
    return _SYM_OPS[code](a, b)
