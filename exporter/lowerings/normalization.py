"""Layer normalization: ``aten.native_layer_norm`` (GPT-2, GPT-NeoX, Phi-2, StarCoder2, OLMo...)
as one LayerNorm node (core ATen keeps ``native_layer_norm`` whole)."""

import torch

from mlxgraph.exporter.lowering_types import LoweringError
from mlxgraph.exporter.lowerings import register

aten = torch.ops.aten


@register(aten.native_layer_norm.default)
def native_layer_norm(ctx, node):
    """One LayerNorm node over the last axis. Only the normalized output is produced: the
    mean and rstd outputs serve training only.

    Raises:
        LoweringError: normalized over more than the last axis.
    """
    x, normalized_shape, weight, bias, eps = node.args
    if len(normalized_shape) != 1:
        raise LoweringError(
            f"layer norm over {len(normalized_shape)} axes (only the last axis is supported)"
        )
    y = ctx.emit_out("LayerNorm", val=ctx.val(node)[0], name=node.name, x=ctx.slot(x),
                     weight=None if weight is None else ctx.slot(weight),
                     bias=None if bias is None else ctx.slot(bias), eps=float(eps))
    return [y, None, None]
