"""Reductions: mean, sum, max, argmax, softmax (and log-softmax through them)."""

import torch

from mlxgraph.exporter.lowering_types import LoweringError, torch_dtype_code
from mlxgraph.exporter.lowerings import register

aten = torch.ops.aten


def _axes(ctx, x, dims):
    rank = len(ctx.shape(x))
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(d % max(rank, 1) for d in dims)


def _cast_input(ctx, x, dtype):
    """x cast to ``dtype`` first (the reductions' dtype= argument), as a slot index."""
    slot = ctx.slot(x)
    if dtype is None or dtype == ctx.val(x).dtype:
        return slot
    val = ctx.val(x).to(dtype)
    return ctx.emit_out("Cast", val=val, name=f"{ctx.node.name}_in", x=slot,
                        dtype=torch_dtype_code(dtype)).index


@register(aten.mean.dim, aten.sum.dim_IntList, aten.mean.default, aten.sum.default)
def mean_sum(ctx, node):
    """Mean or sum over axes (all axes when none are given)."""
    x = node.args[0]
    dims = node.args[1] if len(node.args) > 1 else None
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    xs = _cast_input(ctx, x, node.kwargs.get("dtype"))
    op = "Mean" if node.target in (aten.mean.dim, aten.mean.default) else "Sum"
    return ctx.emit_out(op, x=xs, axes=_axes(ctx, x, dims), keepdims=bool(keepdim))


@register(aten.amax.default)
def amax(ctx, node):
    """Max over axes."""
    x = node.args[0]
    dims = node.args[1] if len(node.args) > 1 else None
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    return ctx.emit_out("Max", x=ctx.slot(x), axes=_axes(ctx, x, dims), keepdims=bool(keepdim))


@register(aten.argmax.default)
def argmax(ctx, node):
    """Index of the max along one axis."""
    x = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if dim is None:
        raise LoweringError("argmax over a flattened tensor is not supported")
    return ctx.emit_out("Argmax", x=ctx.slot(x), axis=_axes(ctx, x, dim)[0], keepdims=bool(keepdim))


@register(aten.max.dim)
def max_dim(ctx, node):
    """(values, indices) along one axis: a Max and an Argmax node."""
    x, dim = node.args[0], node.args[1]
    keepdim = bool(node.args[2] if len(node.args) > 2 else False)
    axis = _axes(ctx, x, dim)[0]
    vals, idx = ctx.val(node)
    values = ctx.emit_out(
        "Max", val=vals, name=f"{node.name}_values", x=ctx.slot(x), axes=[axis], keepdims=keepdim
    )
    indices = ctx.emit_out(
        "Argmax", val=idx, name=f"{node.name}_indices", x=ctx.slot(x), axis=axis, keepdims=keepdim
    )
    return [values, indices]


@register(aten._softmax.default)
def softmax(ctx, node):
    """Softmax along one axis (computed in float32 by the kernel)."""
    x, dim = node.args[0], node.args[1]
    return ctx.emit_out("Softmax", x=ctx.slot(x), axis=_axes(ctx, x, dim)[0])


@register(aten._log_softmax.default)
def log_softmax(ctx, node):
    """log(softmax(x)) as Softmax then Log (no node of its own in the format)."""
    x, dim = node.args[0], node.args[1]
    sm = ctx.emit_out(
        "Softmax", name=f"{node.name}_softmax", x=ctx.slot(x), axis=_axes(ctx, x, dim)[0]
    )
    return ctx.emit_out("Log", x=sm.index)

