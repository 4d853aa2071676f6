"""Matrix products and lookups: mm, bmm, addmm, embedding, index_select, index.

``x @ W.T`` of a constant weight (how ``nn.Linear`` reads after decompositions), and
``x @ W`` of a constant read nowhere else (GPT-2's Conv1D), never reach mm/addmm here:
exporter/fusions.py has already made them one ``aten.linear`` (lowered in fused.py), so
these are the general products.
"""

import torch

from mlxgraph.exporter.lowering_types import LoweringError
from mlxgraph.exporter.lowerings import register

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
    return ctx.emit_out(
        "Addmm",
        bias=ctx.slot(bias),
        a=ctx.slot(a),
        b=ctx.slot(b),
        alpha=float(node.kwargs.get("alpha", 1)),
        beta=float(node.kwargs.get("beta", 1)),
    )


@register(aten.embedding.default)
def embedding(ctx, node):
    """Rows of weight by indices (padding_idx only matters for training)."""
    weight, indices = node.args[0], node.args[1]
    return ctx.emit_out("Embedding", weight=ctx.slot(weight), indices=ctx.slot(indices))


def _take(ctx, node, x, axis: int, index):
    """x's entries at ``index`` along ``axis`` (out shape x.shape[:axis] + index.shape +
    x.shape[axis + 1:]): an Embedding (rows of a table), between Permutes when axis > 0.
    Not a Gather: that op is torch.gather, whose indices match x's rank."""
    if axis == 0:
        return ctx.emit_out("Embedding", weight=ctx.slot(x), indices=ctx.slot(index))
    rank, k = len(ctx.shape(x)), len(ctx.shape(index))
    front = [axis] + [d for d in range(rank) if d != axis]
    moved = ctx.emit_out(
        "Permute",
        val=ctx.val(x).permute(front),
        name=f"{node.name}_front",
        x=ctx.slot(x),
        perm=front,
    )
    rows_val = ctx.val(x).movedim(axis, 0)[ctx.val(index)]
    rows = ctx.emit_out("Embedding", val=rows_val, name=f"{node.name}_rows", weight=moved.index,
                        indices=ctx.slot(index))
    # rows is index.shape + (x's other axes in order); put x's leading axes back in front.
    back = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, k + rank - 1))
    return ctx.emit_out("Permute", x=rows.index, perm=back)


@register(aten.index_select.default)
def index_select(ctx, node):
    """Entries of x along one axis by a 1-D index tensor."""
    x, dim, index = node.args
    return _take(ctx, node, x, dim % len(ctx.shape(x)), index)


@register(aten.index.Tensor)
def index_tensor(ctx, node):
    """x[..., idx, ...] with exactly one index tensor (the form decoders use, e.g. a
    mixture-of-experts layer picking each token's expert weights)."""
    x, indices = node.args
    present = [(i, ix) for i, ix in enumerate(indices) if ix is not None]
    if len(present) != 1:
        raise LoweringError("advanced indexing with more than one index tensor")
    axis, ix = present[0]
    if ctx.val(ix).dtype == torch.bool:
        raise LoweringError("boolean-mask indexing (data-dependent output shape)")
    return _take(ctx, node, x, axis, ix)
