"""Tensors made from nothing: arange, full (zeros, ones), scalar_tensor, full_like."""

import torch

from mlxgraph.exporter.lowering_types import LoweringError, torch_dtype_code
from mlxgraph.exporter.lowerings import register

aten = torch.ops.aten


def _out_dtype(ctx, node) -> int:
    return torch_dtype_code(ctx.val(node).dtype)


@register(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(ctx, node):
    """[start, end) by step, in the traced dtype."""
    if node.target == aten.arange.default:
        start, end, step = 0, node.args[0], 1
    else:
        start, end = node.args[0], node.args[1]
        step = node.args[2] if len(node.args) > 2 else node.kwargs.get("step", 1)
    return ctx.emit_out(
        "Arange",
        start=ctx.operand(start),
        end=ctx.operand(end),
        step=ctx.operand(step),
        dtype=_out_dtype(ctx, node),
    )


def _number(v) -> float:
    if isinstance(v, bool | int | float):
        return float(v)
    raise LoweringError(f"fill value {v!r} must be a number known at export time")


@register(aten.full.default)
def full(ctx, node):
    """A tensor of one value."""
    shape, value = node.args[0], node.args[1]
    return ctx.emit_out(
        "Full", shape=ctx.operands(shape), value=_number(value), dtype=_out_dtype(ctx, node)
    )


@register(aten.scalar_tensor.default)
def scalar_tensor(ctx, node):
    """A 0-d tensor of one value."""
    return ctx.emit_out("Full", shape=[], value=_number(node.args[0]), dtype=_out_dtype(ctx, node))


@register(aten.full_like.default)
def full_like(ctx, node):
    """A tensor of one value shaped like x."""
    x, value = node.args[0], node.args[1]
    shape = [ctx.dim_operand(x, i) for i in range(len(ctx.shape(x)))]
    return ctx.emit_out("Full", shape=shape, value=_number(value), dtype=_out_dtype(ctx, node))

