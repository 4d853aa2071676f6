"""Shapes and layout: reshape, permute, expand, slice, select, cat, squeeze, unsqueeze,
split, casts, and the aliasing ops that need no node at all."""

import torch

from mlxgraph.exporter.lowering_types import LoweringError, Slot, torch_dtype_code
from mlxgraph.exporter.lowerings import register
from mlxgraph.schema.enums import SymOp
from mlxgraph.schema.records import Operand

aten = torch.ops.aten
# Ends this large mean "to the end of the axis" (torch writes sys.maxsize).
_HUGE = 2**31


@register(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
          aten.contiguous.default, aten.lift_fresh.default)
def alias(ctx, node):
    """Same values as the input (copies and views are the same thing in a functional graph)."""
    return ctx.lookup(node.args[0])


@register(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout)
def to_copy(ctx, node):
    """A dtype cast; no node when the dtype does not change (device and layout are moot)."""
    x = node.args[0]
    want, have = ctx.val(node).dtype, ctx.val(x).dtype
    if want == have:
        return ctx.lookup(x)
    return ctx.emit_out("Cast", x=ctx.slot(x), dtype=torch_dtype_code(want))


def _same_shape(ctx, a, b) -> bool:
    sa, sb = ctx.shape(a), ctx.shape(b)
    return len(sa) == len(sb) and all(
        (x == y) if isinstance(x, int) and isinstance(y, int) else str(x) == str(y)
        for x, y in zip(sa, sb, strict=True)
    )


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(ctx, node):
    """Reshape; no node when the shape does not change."""
    x, shape = node.args
    if _same_shape(ctx, x, node):
        return ctx.lookup(x)
    return ctx.emit_out("Reshape", x=ctx.slot(x), shape=ctx.operands(shape))


@register(aten.permute.default)
def permute(ctx, node):
    """Axis permutation; no node for the identity."""
    x, perm = node.args
    rank = len(ctx.shape(x))
    perm = [p % rank for p in perm]
    if perm == list(range(rank)):
        return ctx.lookup(x)
    return ctx.emit_out("Permute", x=ctx.slot(x), perm=perm)


@register(aten.transpose.int)
def transpose(ctx, node):
    """Swap two axes (a Permute)."""
    x, d0, d1 = node.args
    rank = len(ctx.shape(x))
    perm = list(range(rank))
    perm[d0 % rank], perm[d1 % rank] = perm[d1 % rank], perm[d0 % rank]
    return ctx.emit_out("Permute", x=ctx.slot(x), perm=perm)


@register(aten.t.default)
def t(ctx, node):
    """Transpose of a matrix (a Permute)."""
    return ctx.emit_out("Permute", x=ctx.slot(node.args[0]), perm=[1, 0])


@register(aten.expand.default)
def expand(ctx, node):
    """Broadcast to a shape (-1 keeps an axis); no node when nothing changes."""
    x, shape = node.args[0], node.args[1]
    if _same_shape(ctx, x, node):
        return ctx.lookup(x)
    return ctx.emit_out("Expand", x=ctx.slot(x), shape=ctx.operands(shape))


def _index(ctx, x, axis, i, default) -> Operand:
    """A slice bound or index as a non-negative Operand (torch clamps; so do we, statically)."""
    size = ctx.shape(x)[axis]
    if i is None:
        i = default
    if isinstance(i, torch.fx.Node):
        return ctx.operand(i)
    if i == "end" or i >= _HUGE:
        return ctx.dim_operand(x, axis)
    if isinstance(size, int):
        if i < 0:
            i += size
        return Operand.literal(min(max(i, 0), size))
    if i >= 0:
        return Operand.literal(i)
    return ctx.symbols.arith(SymOp.add, ctx.dim_operand(x, axis), Operand.literal(i), ctx)


@register(aten.slice.Tensor)
def slice_(ctx, node):
    """x[start:end:step] on one axis; no node for the whole axis."""
    args = list(node.args) + [None] * (5 - len(node.args))
    x, dim, start, end, step = args[:5]
    dim = node.kwargs.get("dim", dim if dim is not None else 0)
    step = node.kwargs.get("step", step if step is not None else 1)
    axis = dim % len(ctx.shape(x))
    if not isinstance(step, int) or step < 1:
        raise LoweringError(f"slice step {step!r} (only positive static steps)")
    if _same_shape(ctx, x, node) and step == 1:
        return ctx.lookup(x)
    s = _index(ctx, x, axis, node.kwargs.get("start", start), 0)
    e = _index(ctx, x, axis, node.kwargs.get("end", end), "end")
    return ctx.emit_out("Slice", x=ctx.slot(x), axis=axis, start=s, end=e, step=step)


@register(aten.select.int)
def select(ctx, node):
    """x[..., index, ...]: one axis removed."""
    x, dim, index = node.args
    axis = dim % len(ctx.shape(x))
    return ctx.emit_out("Select", x=ctx.slot(x), axis=axis, index=_index(ctx, x, axis, index, 0))


@register(aten.cat.default)
def cat(ctx, node):
    """Concatenate along one axis (empty 1-D inputs, which torch skips, are dropped)."""
    tensors = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    rank = len(ctx.shape(node))
    kept = [
        t for t in tensors if not (len(ctx.shape(t)) == 1 and ctx.shape(t)[0] == 0 and rank != 1)
    ]
    if len(kept) == 1:
        return ctx.lookup(kept[0])
    return ctx.emit_out("Concat", inputs=[ctx.slot(t) for t in kept], axis=dim % rank)


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(ctx, node):
    """Remove axes of static size 1 (torch leaves other named axes alone)."""
    x = node.args[0]
    shape = ctx.shape(x)
    rank = len(shape)
    dims = node.args[1] if len(node.args) > 1 else list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    axes = sorted(
        {d % rank for d in dims if isinstance(shape[d % rank], int) and shape[d % rank] == 1}
    )
    if not axes:
        return ctx.lookup(x)
    return ctx.emit_out("Squeeze", x=ctx.slot(x), axes=axes)


@register(aten.unsqueeze.default)
def unsqueeze(ctx, node):
    """Insert an axis of size 1."""
    x, dim = node.args
    return ctx.emit_out("Unsqueeze", x=ctx.slot(x), axis=dim % (len(ctx.shape(x)) + 1))


@register(aten.split_with_sizes.default, aten.split.Tensor)
def split(ctx, node):
    """Split along one axis into pieces of static sizes; read through getitem."""
    x = node.args[0]
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    axis = dim % len(ctx.shape(x))
    vals = ctx.val(node)
    sizes = [v.shape[axis] for v in vals]
    if not all(isinstance(s, int) for s in sizes):
        raise LoweringError("split into symbolic sizes")
    outs = [ctx.new_tensor(val=v, name=f"{node.name}_{i}") for i, v in enumerate(vals)]
    ctx.emit("Split", x=ctx.slot(x), outs=outs, axis=axis, sizes=sizes)
    return [Slot(o) for o in outs]
