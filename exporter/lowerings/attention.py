"""The attention op: ``mlxgraph::update_and_attend`` to an UpdateAndAttendNode."""

import torch

from mlxgraph.exporter import attention_op  # noqa: F401  (registers the op with torch)
from mlxgraph.exporter.lowering_types import LoweringError, torch_dtype_code
from mlxgraph.exporter.lowerings import register


@register(torch.ops.mlxgraph.update_and_attend.default)
def update_and_attend(ctx, node):
    """q, k, v and the [T, 1] positions; layer_id, scale and out_dtype are static."""
    args = list(node.args) + [None] * (7 - len(node.args))
    q, k, v, position, layer_id, scale, out_dtype = args[:7]
    out_dtype = node.kwargs.get("out_dtype", out_dtype)
    if not isinstance(layer_id, int) or not isinstance(scale, int | float):
        raise LoweringError("layer_id and scale must be static numbers")
    code = None if out_dtype is None else torch_dtype_code(out_dtype)
    return ctx.emit_out(
        "UpdateAndAttend",
        q=ctx.slot(q),
        k=ctx.slot(k),
        v=ctx.slot(v),
        position=ctx.slot(position),
        layer_id=layer_id,
        scale=float(scale),
        out_dtype=code,
    )
