"""Matrix products and lookups: mm, bmm, addmm (fused into Linear when b is a transposed
weight), embedding, index_select.

After decompositions ``nn.Linear`` reads ``view -> mm(x, permute(W, [1, 0])) -> view``.
The permute of a constant weight whose every user is such a product emits no node (see
layout.permute); the product then becomes one LinearNode reading W as torch stores it.
"""

from dataclasses import dataclass

import torch

from mlxgraph.exporter.lowerings import LoweringError, register

aten = torch.ops.aten


@dataclass(frozen=True)
class TransposedWeight:
    """A constant weight read transposed ([out, in] stored, [in, out] used); no node of its own."""

    slot: int


def _default_scale(node) -> bool:
    return node.kwargs.get("beta", 1) == 1 and node.kwargs.get("alpha", 1) == 1


def fuses_as_linear_weight(node, user) -> bool:
    """True when ``user`` reads ``node`` as the right-hand side of a plain product."""
    if user.target == aten.mm.default:
        return len(user.args) == 2 and user.args[1] is node and user.args[0] is not node
    if user.target == aten.addmm.default:
        return (len(user.args) == 3 and user.args[2] is node and node not in user.args[:2]
                and _default_scale(user))
    return False


@register(aten.mm.default, aten.bmm.default)
def mm(ctx, node):
    """a @ b; x @ W.T as a LinearNode when b is a transposed weight."""
    a, b = node.args
    rb = ctx.lookup(b)
    if isinstance(rb, TransposedWeight):
        return ctx.emit_out("Linear", x=ctx.slot(a), weight=rb.slot)
    return ctx.emit_out("Matmul", a=ctx.slot(a), b=ctx.slot(b))


@register(aten.addmm.default)
def addmm(ctx, node):
    """beta * bias + alpha * (a @ b); a LinearNode with bias when b is a transposed weight."""
    bias, a, b = node.args
    rb = ctx.lookup(b)
    if isinstance(rb, TransposedWeight):
        if len(ctx.shape(bias)) != 1:
            raise LoweringError("addmm with a transposed weight needs a 1-D bias")
        return ctx.emit_out("Linear", x=ctx.slot(a), weight=rb.slot, bias=ctx.slot(bias))
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
