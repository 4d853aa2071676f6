"""Ops with off-graph recurrent state: ``mlxgraph::causal_conv`` to a CausalConvNode,
``::ssd_scan`` to an SsdScanNode, ``::gated_delta`` to a GatedDeltaNode and
``::selective_scan`` to a SelectiveScanNode."""

import torch

from mlxgraph.exporter import state_op  # noqa: F401  (registers the op with torch)
from mlxgraph.exporter.lowering_types import LoweringError
from mlxgraph.exporter.lowerings import register


@register(torch.ops.mlxgraph.causal_conv.default)
def causal_conv(ctx, node):
    """x [B, C, T], weight [C, K], optional bias [C]; layer_id static."""
    args = dict(zip(("x", "weight", "bias", "layer_id"), node.args))
    args.update(node.kwargs)
    if not isinstance(args["layer_id"], int):
        raise LoweringError("layer_id must be a static int")
    bias = args.get("bias")
    return ctx.emit_out("CausalConv", x=ctx.slot(args["x"]), weight=ctx.slot(args["weight"]),
                        bias=None if bias is None else ctx.slot(bias),
                        layer_id=args["layer_id"])


@register(torch.ops.mlxgraph.ssd_scan.default)
def ssd_scan(ctx, node):
    """x, dt, a, b, c, d, dt_bias tensors; layer_id static."""
    names = ("x", "dt", "a", "b", "c", "d", "dt_bias", "layer_id")
    args = dict(zip(names, node.args))
    args.update(node.kwargs)
    if not isinstance(args["layer_id"], int):
        raise LoweringError("layer_id must be a static int")
    return ctx.emit_out("SsdScan", **{n: ctx.slot(args[n]) for n in names[:-1]},
                        layer_id=args["layer_id"])


@register(torch.ops.mlxgraph.gated_delta.default)
def gated_delta(ctx, node):
    """q, k, v, g, beta tensors; layer_id, scale and qk_l2norm static."""
    names = ("q", "k", "v", "g", "beta", "layer_id", "scale", "qk_l2norm")
    args = dict(zip(names, node.args))
    args.update(node.kwargs)
    if not isinstance(args["layer_id"], int) or not isinstance(args["scale"], int | float):
        raise LoweringError("layer_id and scale must be static numbers")
    return ctx.emit_out("GatedDelta", **{n: ctx.slot(args[n]) for n in names[:5]},
                        layer_id=args["layer_id"], scale=float(args["scale"]),
                        qk_l2norm=bool(args.get("qk_l2norm", False)))


@register(torch.ops.mlxgraph.selective_scan.default)
def selective_scan(ctx, node):
    """x, dt, a, b, c, d and an optional dt_bias; layer_id static."""
    names = ("x", "dt", "a", "b", "c", "d", "dt_bias", "layer_id")
    args = dict(zip(names, node.args))
    args.update(node.kwargs)
    if not isinstance(args["layer_id"], int):
        raise LoweringError("layer_id must be a static int")
    slots = {n: None if args.get(n) is None else ctx.slot(args[n]) for n in names[:-1]}
    return ctx.emit_out("SelectiveScan", **slots, layer_id=args["layer_id"])
