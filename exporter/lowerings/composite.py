"""ATen ops written as several existing nodes, each exact: floor, clamp with tensor bounds,
copy, repeat, var, vector norms, slice_scatter and scatter of a value (the top-k routers'
masks).

A lowering here adds no op to the format: every node it emits computes what torch
computes, value for value (floor(x) is x // 1 in IEEE arithmetic; a scatter of one value
is a where over a one-hot match of the indices).
"""

import math

import torch

from mlxgraph.exporter.lowering_types import LoweringError, Slot, torch_dtype_code
from mlxgraph.exporter.lowerings import register
from mlxgraph.exporter.lowerings.layout import _index, _same_shape
from mlxgraph.schema.enums import RoundingMode
from mlxgraph.schema.records import Operand

aten = torch.ops.aten


def _fake(ctx, ref, shape, dtype=None):
    """A traced value of ``shape`` (and dtype, default ref's) for an intermediate slot."""
    v = ctx.val(ref)
    return v.new_empty(tuple(shape), dtype=v.dtype if dtype is None else dtype)


def _part(ctx, op, val, what, **fields):
    """Emit an intermediate node named after the node being lowered; its slot index."""
    return ctx.emit_out(op, val=val, name=f"{ctx.node.name}_{what}", **fields).index


@register(aten.floor.default)
def floor(ctx, node):
    """floor(x) as x // 1 (a Div with floor rounding: the quotient by 1 is x itself)."""
    return ctx.emit_out("Div", a=ctx.operand(node.args[0]), b=Operand.literal(1),
                        rounding=RoundingMode.floor)


@register(aten.clamp.Tensor)
def clamp_tensor(ctx, node):
    """min(max(x, lo), hi) with tensor bounds (either may be absent)."""
    x = node.args[0]
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    if lo is None and hi is None:
        return ctx.lookup(x)
    out = ctx.operand(x)
    if lo is not None:
        if hi is None:
            return ctx.emit_out("Maximum", a=out, b=ctx.operand(lo))
        out = Operand.tensor(_part(ctx, "Maximum", ctx.val(node), "min", a=out,
                                   b=ctx.operand(lo)))
    return ctx.emit_out("Minimum", a=out, b=ctx.operand(hi))


@register(aten.copy.default)
def copy(ctx, node):
    """src's values in dst's shape and dtype (a functional copy_: dst's values are unused)."""
    dst, src = node.args[0], node.args[1]
    out = ctx.lookup(src)
    if ctx.val(src).dtype != ctx.val(node).dtype:
        out = ctx.emit_out("Cast", val=_fake(ctx, src, ctx.shape(src), ctx.val(node).dtype),
                           name=f"{node.name}_cast", x=out.index,
                           dtype=torch_dtype_code(ctx.val(node).dtype))
    if _same_shape(ctx, src, node):
        return out
    shape = [ctx.dim_operand(dst, i) for i in range(len(ctx.shape(dst)))]
    return ctx.emit_out("Expand", x=out.index, shape=shape)


@register(aten.repeat.default)
def repeat(ctx, node):
    """x tiled ``repeats`` times per axis: leading axes added, then copies concatenated."""
    x, repeats = node.args[0], list(node.args[1])
    if not all(isinstance(r, int) and r >= 1 for r in repeats):
        raise LoweringError(f"repeat by {repeats} (only static counts >= 1)")
    out, val = ctx.slot(x), ctx.val(x)
    for _ in range(len(repeats) - len(ctx.shape(x))):
        val = val.unsqueeze(0)
        out = _part(ctx, "Unsqueeze", val, f"lead{val.dim()}", x=out, axis=0)
    for axis, r in enumerate(repeats):
        if r > 1:
            val = torch.cat([val] * r, dim=axis)
            out = _part(ctx, "Concat", val, f"axis{axis}", inputs=[out] * r, axis=axis)
    return Slot(out)


def _axes(ctx, x, dims) -> list:
    rank = len(ctx.shape(x))
    if dims is None or len(dims) == 0:
        return list(range(rank))
    return sorted(d % rank for d in dims)


@register(aten.var.correction)
def var(ctx, node):
    """sum((x - mean)^2) / (N - correction) over axes, as torch (N - correction floored at 0)."""
    x = node.args[0]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    correction = node.kwargs.get("correction")
    correction = 1 if correction is None else correction
    keepdim = bool(node.kwargs.get("keepdim", False))
    axes = _axes(ctx, x, dims)
    sizes = [ctx.shape(x)[a] for a in axes]
    if not all(isinstance(s, int) for s in sizes) or not isinstance(correction, int | float):
        raise LoweringError("var over an axis of runtime size or with a runtime correction")
    n = 1
    for s in sizes:
        n *= s
    kept = [1 if i in axes else s for i, s in enumerate(ctx.shape(x))]
    mean = _part(ctx, "Mean", _fake(ctx, x, kept), "mean", x=ctx.slot(x), axes=axes,
                 keepdims=True)
    dev = _part(ctx, "Sub", ctx.val(x), "dev", a=Operand.tensor(ctx.slot(x)),
                b=Operand.tensor(mean))
    sq = _part(ctx, "Mul", ctx.val(x), "sq", a=Operand.tensor(dev), b=Operand.tensor(dev))
    total = _part(ctx, "Sum", ctx.val(node), "sum", x=sq, axes=axes, keepdims=keepdim)
    return ctx.emit_out("Div", a=Operand.tensor(total),
                        b=Operand.literal(float(max(0, n - correction))))


@register(aten.linalg_vector_norm.default)
def vector_norm(ctx, node):
    """The p-norm over axes, sum(|x|^p)^(1/p): p = 1 a sum of |x|, p = 2 a square root, p =
    inf a max of |x| (DBRX's router normalises its top-k weights by one)."""
    args = list(node.args) + [None] * (4 - len(node.args))
    x = args[0]
    p = node.kwargs.get("ord", 2 if args[1] is None else args[1])
    dims = node.kwargs.get("dim", args[2])
    keepdim = bool(node.kwargs.get("keepdim", args[3] or False))
    if node.kwargs.get("dtype") is not None:
        raise LoweringError("vector_norm with a dtype argument")
    if not isinstance(p, int | float) or not p > 0:
        raise LoweringError(f"vector_norm of order {p!r} (only positive orders)")
    axes = _axes(ctx, x, dims)
    magnitude = _part(ctx, "Abs", ctx.val(x), "abs", x=ctx.slot(x))
    if math.isinf(p):
        return ctx.emit_out("Max", x=magnitude, axes=axes, keepdims=keepdim)
    if p != 1:
        magnitude = _part(ctx, "Pow", ctx.val(x), "pow", a=Operand.tensor(magnitude),
                          b=Operand.literal(float(p)))
    if p == 1:
        return ctx.emit_out("Sum", x=magnitude, axes=axes, keepdims=keepdim)
    total = _part(ctx, "Sum", ctx.val(node), "sum", x=magnitude, axes=axes, keepdims=keepdim)
    if p == 2:
        return ctx.emit_out("Sqrt", x=total)
    return ctx.emit_out("Pow", a=Operand.tensor(total), b=Operand.literal(1.0 / p))


@register(aten.slice_scatter.default)
def slice_scatter(ctx, node):
    """x with x[start:end] along ``dim`` replaced by src: the parts around it and src,
    concatenated (step 1 only)."""
    args = list(node.args) + [None] * (6 - len(node.args))
    x, src, dim, start, end, step = args[:6]
    dim = node.kwargs.get("dim", 0 if dim is None else dim)
    step = node.kwargs.get("step", 1 if step is None else step)
    if step != 1:
        raise LoweringError(f"slice_scatter with step {step!r} (only step 1)")
    axis = dim % len(ctx.shape(x))
    s = _index(ctx, x, axis, node.kwargs.get("start", start), 0)
    e = _index(ctx, x, axis, node.kwargs.get("end", end), "end")
    size = ctx.dim_operand(x, axis)
    before = [slice(None)] * axis
    pieces = []
    if s != Operand.literal(0):
        pieces.append(_part(ctx, "Slice", ctx.val(x)[(*before, slice(0, ctx.val(start)))],
                            "head", x=ctx.slot(x), axis=axis, start=Operand.literal(0), end=s,
                            step=1))
    pieces.append(ctx.slot(src))
    if e != size:
        pieces.append(_part(ctx, "Slice", ctx.val(x)[(*before, slice(ctx.val(end), None))],
                            "tail", x=ctx.slot(x), axis=axis, start=e, end=size, step=1))
    if len(pieces) == 1:
        return ctx.lookup(src)
    return ctx.emit_out("Concat", inputs=pieces, axis=axis)


@register(aten.scatter.value)
def scatter_value(ctx, node):
    """x with ``value`` written where ``index`` points along ``dim``: Where(any over the
    indices of index == arange(N), value, x). The index must cover x on the other axes."""
    x, dim, index, value = node.args[:4]
    shape, ishape = ctx.shape(x), ctx.shape(index)
    axis = dim % len(shape)
    n = shape[axis]
    if not isinstance(value, bool | int | float):
        raise LoweringError("scatter of a runtime value")
    if not isinstance(n, int) or len(ishape) != len(shape) or any(
            str(a) != str(b) for i, (a, b) in enumerate(zip(shape, ishape)) if i != axis):
        raise LoweringError("scatter whose index does not cover x on the other axes, or along "
                            "an axis of runtime size")
    idx = ctx.val(index)
    probe = [1] * (len(shape) + 1)
    probe[axis + 1] = n
    rng = _part(ctx, "Arange", _fake(ctx, index, [n]), "range", start=Operand.literal(0),
                end=Operand.literal(n), step=Operand.literal(1), dtype=torch_dtype_code(idx.dtype))
    rng = _part(ctx, "Reshape", _fake(ctx, index, probe), "probe", x=rng,
                shape=[Operand.literal(p) for p in probe])
    wide = idx.unsqueeze(axis + 1)
    col = _part(ctx, "Unsqueeze", wide, "col", x=ctx.slot(index), axis=axis + 1)
    hits = [*wide.shape]
    hits[axis + 1] = n
    match = _part(ctx, "Equal", _fake(ctx, index, hits, torch.bool), "match",
                  a=Operand.tensor(col), b=Operand.tensor(rng))
    hit = _part(ctx, "Max", _fake(ctx, x, shape, torch.bool), "hit", x=match, axes=[axis],
                keepdims=False)
    return ctx.emit_out("Where", cond=hit, a=Operand.literal(value), b=ctx.operand(x))
