"""Matrix products and lookups: mm, bmm, addmm, embedding, index_select, index.

``x @ W.T`` of a constant weight (how ``nn.Linear`` reads after decompositions) never
reaches mm/addmm here: exporter/fusions.py has already made it one ``aten.linear``
(lowered in fused.py), so these are the general products.
"""

import torch

from mlxgraph.exporter.lowerings import LoweringError, register

aten = torch.ops.aten


@register(aten.mm.default, aten.bmm.default)
def mm(ctx, node):
    """a @ b."""
    a, b = node.args
    return ctx.emit_out("Matmul", a=ctx.slot(a), b=ctx.slot(b))


@register(aten.addmm.default)
def addmm(ctx, node):
    """beta * bias + alpha * (a @ b)."""
    bias, a, b = node.args
    return ctx.emit_out("Addmm", bias=ctx.slot(bias), a=ctx.slot(a), b=ctx.slot(b),
                        alpha=float(node.kwargs.get("alpha", 1)), beta=float(node.kwargs.get("beta", 1)))


@register(aten.embedding.default)
def embedding(ctx, node):
    """Rows of weight by indices (padding_idx only matters for training)."""
    weight, indices = node.args[0], node.args[1]
    return ctx.emit_out("Embedding", weight=ctx.slot(weight), indices=ctx.slot(indices))


@register(aten.index_select.default)
def index_select(ctx, node):
    """Entries of x along one axis by a 1-D index tensor."""
    x, dim, index = node.args
    axis = dim % len(ctx.shape(x))
    return ctx.emit_out("Gather", x=ctx.slot(x), indices=ctx.slot(index), axis=axis)


@register(aten.index.Tensor)
def index_tensor(ctx, node):
    """x[..., idx, ...] with exactly one index tensor (the form decoders use)."""
    x, indices = node.args
    present = [(i, ix) for i, ix in enumerate(indices) if ix is not None]
    if len(present) != 1:
        raise LoweringError("advanced indexing with more than one index tensor")
    axis, ix = present[0]
    return ctx.emit_out("Gather", x=ctx.slot(x), indices=ctx.slot(ix), axis=axis)
