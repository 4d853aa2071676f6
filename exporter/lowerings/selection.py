"""Selection: ``aten.topk`` (the routers of mixture-of-experts decoders) as one TopK node,
``aten.gather`` (the routers picking their chosen scores) as one Gather node."""

import torch

from mlxgraph.exporter.lowering_types import LoweringError, Slot
from mlxgraph.exporter.lowerings import register

aten = torch.ops.aten


@register(aten.topk.default)
def topk(ctx, node):
    """(values, indices) of the k largest or smallest entries along one axis; read through
    getitem. ``sorted=False`` lets torch return any order, so the sorted node serves it too."""
    args = list(node.args) + [None] * (5 - len(node.args))
    x, k, dim, largest = args[0], args[1], args[2], args[3]
    dim = node.kwargs.get("dim", -1 if dim is None else dim)
    largest = node.kwargs.get("largest", True if largest is None else largest)
    if not isinstance(k, int):
        raise LoweringError(f"topk with a runtime k ({k}): only a static k is supported")
    axis = dim % len(ctx.shape(x))
    outs = [
        ctx.new_tensor(val=v, name=f"{node.name}_{part}")
        for v, part in zip(ctx.val(node), ("values", "indices"), strict=True)
    ]
    ctx.emit("TopK", x=ctx.slot(x), outs=outs, k=k, axis=axis, largest=bool(largest))
    return [Slot(o) for o in outs]


@register(aten.gather.default)
def gather(ctx, node):
    """torch.gather: x's entries at ``index`` along one axis, index of x's rank (a Gather)."""
    x, dim, index = node.args[:3]
    return ctx.emit_out("Gather", x=ctx.slot(x), indices=ctx.slot(index),
                        axis=dim % len(ctx.shape(x)))
