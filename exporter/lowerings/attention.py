"""The attention op: ``mlxgraph::update_and_attend`` to an UpdateAndAttendNode."""

import torch

from mlxgraph.exporter import attention_op  # noqa: F401  (registers the op with torch)
from mlxgraph.exporter.lowering_types import LoweringError, torch_dtype_code
from mlxgraph.exporter.lowerings import register


@register(torch.ops.mlxgraph.update_and_attend.default)
def update_and_attend(ctx, node):
    """q, k, v, the [T, 1] positions and optional [Hq] sinks; layer_id, scale, out_dtype
    and softcap are static. A latent-attention call (value_width > 0) passes its keys as v:
    its values' width is the layer's cache geometry (LayerCache.values_in_keys), not the
    node's. ALiBi slopes (format 1.3) are a static list, one per query head."""
    names = ("q", "k", "v", "position", "layer_id", "scale", "out_dtype", "sinks", "softcap",
             "value_width", "alibi_slopes")
    args = dict(zip(names, node.args))
    args.update(node.kwargs)
    layer_id, scale, out_dtype = args["layer_id"], args["scale"], args.get("out_dtype")
    sinks, softcap = args.get("sinks"), args.get("softcap") or 0.0
    slopes = args.get("alibi_slopes")
    static = isinstance(layer_id, int) and all(
        isinstance(x, int | float) for x in (scale, softcap, *(slopes or ())))
    if not static:
        raise LoweringError("layer_id, scale, softcap and ALiBi slopes must be static numbers")
    if args.get("value_width") and args["v"] is not args["k"]:
        raise LoweringError("a latent-attention call (value_width) must pass its keys as v")
    code = None if out_dtype is None else torch_dtype_code(out_dtype)
    tensors = {name: ctx.slot(args[name]) for name in ("q", "k", "v", "position")}
    return ctx.emit_out("UpdateAndAttend", **tensors, layer_id=layer_id, scale=float(scale),
                        out_dtype=code, sinks=None if sinks is None else ctx.slot(sinks),
                        softcap=float(softcap) or None,
                        alibi_slopes=None if slopes is None else [float(x) for x in slopes])
