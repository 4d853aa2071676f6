"""Runtime integers: tensor sizes (SymSize) and arithmetic on them (SymArith)."""

import math
import operator

import torch

from mlxgraph.exporter.lowering_types import LoweringError
from mlxgraph.exporter.lowerings import register
from mlxgraph.schema.enums import SymOp
from mlxgraph.schema.records import Operand

aten = torch.ops.aten


@register(aten.sym_size.int)
def sym_size(ctx, node):
    """A tensor's size on one axis: its symbol's value slot, or a SymSize node."""
    x, axis = node.args
    rank = len(ctx.shape(x))
    return ctx.symbols.operand(ctx.val(node), ctx, tensor=ctx.slot(x), axis=axis % rank)


# target -> (graph SymOp, the same operation on Python ints for literal operands)
_ARITH = {
    operator.add: (SymOp.add, operator.add),
    operator.sub: (SymOp.sub, operator.sub),
    operator.mul: (SymOp.mul, operator.mul),
    operator.floordiv: (SymOp.floordiv, operator.floordiv),
    operator.mod: (SymOp.mod, operator.mod),
    torch.sym_max: (SymOp.max, max),
    torch.sym_min: (SymOp.min, min),
}


def _arith(ctx, node):
    val = ctx.val(node)
    if isinstance(val, int):
        return Operand.literal(val)  # torch already knows the answer
    a, b = (ctx.operand(x) for x in node.args)
    if a.kind not in ("value", "int") or b.kind not in ("value", "int"):
        raise LoweringError(f"runtime arithmetic on non-integers ({a}, {b})")
    code, py = _ARITH[node.target]
    if a.is_literal and b.is_literal:
        return Operand.literal(int(py(a.python_value(), b.python_value())))
    out = ctx.symbols.arith(code, a, b, ctx)
    ctx.symbols.computed.setdefault(val.node.expr, out)
    return out


for _t in _ARITH:
    register(_t)(_arith)


@register(operator.neg)
def neg(ctx, node):
    """Negated runtime int."""
    val = ctx.val(node)
    if isinstance(val, int):
        return Operand.literal(val)
    out = ctx.new_value()
    ctx.emit("SymArith", op=int(SymOp.neg), a=ctx.operand(node.args[0]), out=out)
    return Operand.value(out)


@register(math.ceil, math.floor, math.trunc, torch.sym_int)
def known_int(ctx, node):
    """Rounding that torch resolved at trace time; anything still symbolic is unsupported."""
    val = ctx.val(node)
    if isinstance(val, int):
        return Operand.literal(val)
    raise LoweringError(f"symbolic rounding {val} is not supported")


@register(operator.getitem)
def getitem(ctx, node):
    """An element of a multi-output op's result."""
    seq, index = node.args
    value = ctx.lookup(seq)
    if not isinstance(value, list | tuple):
        raise LoweringError("getitem on a value that is not a list of outputs")
    out = value[index]
    if out is None:
        raise LoweringError(f"output {index} of {seq.name} is not produced")
    return out


@register(aten._assert_tensor_metadata.default, aten._assert_scalar.default,
          aten.sym_constrain_range_for_size.default, aten.sym_constrain_range.default,
          torch._check, torch._check_is_size)
def no_value(ctx, node):
    """Checks that torch.export already proved or that the interpreter enforces: no node."""
    return None
