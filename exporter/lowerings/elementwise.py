"""Elementwise ops: unary, binary (tensor/scalar operands), comparisons, where, clamp."""

import torch

from mlxgraph.exporter.lowering_types import LoweringError
from mlxgraph.exporter.lowerings import register
from mlxgraph.schema.enums import RoundingMode
from mlxgraph.schema.op_catalogue import Trait, ops_with
from mlxgraph.schema.records import Operand

aten = torch.ops.aten

# The catalogue names the ATen op of each generic unary op (schema/op_catalogue.py).
_UNARY = {getattr(aten, op.aten).default: op.name
          for op in ops_with(Trait.UNARY) if op.aten is not None}


def _unary(ctx, node):
    return ctx.emit_out(_UNARY[node.target], x=ctx.slot(node.args[0]))


for _t in _UNARY:
    register(_t)(_unary)


@register(aten.bitwise_not.default)
def bitwise_not(ctx, node):
    """Logical not of a bool tensor (the only bitwise_not a decoder uses)."""
    if ctx.val(node.args[0]).dtype != torch.bool:
        raise LoweringError("bitwise_not is supported on bool tensors only")
    return ctx.emit_out("LogicalNot", x=ctx.slot(node.args[0]))


@register(aten.gelu.default)
def gelu(ctx, node):
    """GELU, exact or with the tanh approximation."""
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    return ctx.emit_out("Gelu", x=ctx.slot(node.args[0]), approximate=approximate == "tanh")


@register(aten.relu.default)
def relu(ctx, node):
    """max(x, 0), with the literal kept weak so the dtype stays x's."""
    return ctx.emit_out("Maximum", a=ctx.operand(node.args[0]), b=Operand.literal(0))


@register(aten.clamp.default)
def clamp(ctx, node):
    """Clamp to scalar bounds (either may be absent)."""
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    for b in (lo, hi):
        if b is not None and not isinstance(b, int | float):
            raise LoweringError("clamp bounds must be numbers")
    return ctx.emit_out(
        "Clamp",
        x=ctx.slot(node.args[0]),
        min=None if lo is None else float(lo),
        max=None if hi is None else float(hi),
    )


_BINARY = {
    aten.mul.Tensor: "Mul",
    aten.mul.Scalar: "Mul",
    aten.div.Tensor: "Div",
    aten.div.Scalar: "Div",
    aten.pow.Tensor_Scalar: "Pow",
    aten.pow.Tensor_Tensor: "Pow",
    aten.pow.Scalar: "Pow",
    aten.maximum.default: "Maximum",
    aten.minimum.default: "Minimum",
    aten.remainder.Tensor: "Remainder",
    aten.remainder.Scalar: "Remainder",
    aten.eq.Tensor: "Equal",
    aten.eq.Scalar: "Equal",
    aten.ne.Tensor: "NotEqual",
    aten.ne.Scalar: "NotEqual",
    aten.lt.Tensor: "Less",
    aten.lt.Scalar: "Less",
    aten.le.Tensor: "LessEqual",
    aten.le.Scalar: "LessEqual",
    aten.gt.Tensor: "Greater",
    aten.gt.Scalar: "Greater",
    aten.ge.Tensor: "GreaterEqual",
    aten.ge.Scalar: "GreaterEqual",
    aten.logical_and.default: "LogicalAnd",
    aten.logical_or.default: "LogicalOr",
    aten.bitwise_and.Tensor: "LogicalAnd",
    aten.bitwise_or.Tensor: "LogicalOr",
}
_BOOL_ONLY = {aten.bitwise_and.Tensor, aten.bitwise_or.Tensor}


def _binary(ctx, node):
    if node.target in _BOOL_ONLY and ctx.val(node).dtype != torch.bool:
        raise LoweringError("bitwise ops are supported on bool tensors only")
    a, b = ctx.operand(node.args[0]), ctx.operand(node.args[1])
    return ctx.emit_out(_BINARY[node.target], a=a, b=b)


for _t in _BINARY:
    register(_t)(_binary)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(ctx, node):
    """Division with rounding_mode None, 'trunc' or 'floor'."""
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    rounding = {None: RoundingMode.none, "trunc": RoundingMode.trunc,
                "floor": RoundingMode.floor}[mode]
    return ctx.emit_out(
        "Div", a=ctx.operand(node.args[0]), b=ctx.operand(node.args[1]), rounding=rounding
    )


@register(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar)
def add_sub(ctx, node):
    """a + alpha * b (and a - alpha * b; rsub swaps the sides)."""
    a, b = node.args[0], node.args[1]
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
    is_sub = node.target in (aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar)
    rb = ctx.operand(b)
    if alpha != 1:
        if rb.is_literal:
            rb = Operand.literal(rb.python_value() * alpha)
        else:
            rb = ctx.emit_out(
                "Mul", val=ctx.val(b), name=f"{node.name}_alpha", a=rb, b=Operand.literal(alpha)
            )
            rb = Operand.tensor(rb.index)
    ra = ctx.operand(a)
    if node.target == aten.rsub.Scalar:
        ra, rb = rb, ra
    return ctx.emit_out("Sub" if is_sub else "Add", a=ra, b=rb)


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, node):
    """cond ? a : b."""
    cond, a, b = node.args
    return ctx.emit_out("Where", cond=ctx.slot(cond), a=ctx.operand(a), b=ctx.operand(b))
