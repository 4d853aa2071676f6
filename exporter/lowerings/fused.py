"""Fused nodes made by exporter/fusions.py: Linear on any rank, RmsNorm, Rope."""

import torch

from mlxgraph.exporter.fusions import fused_rms_norm, fused_rope
from mlxgraph.exporter.lowerings import register

aten = torch.ops.aten


@register(aten.linear.default)
def linear(ctx, node):
    """x @ W.T (+ b) on x's own shape; W as torch stores it, [out, in]."""
    x, weight = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    return ctx.emit_out("Linear", x=ctx.slot(x), weight=ctx.slot(weight),
                        bias=None if bias is None else ctx.slot(bias))


@register(fused_rms_norm)
def rms_norm(ctx, node):
    """x * rsqrt(mean(x^2, -1) + eps) * (weight + offset), in float32."""
    x, weight, eps, offset = node.args
    return ctx.emit_out(
        "RmsNorm",
        x=ctx.slot(x),
        weight=None if weight is None else ctx.slot(weight),
        eps=float(eps),
        weight_offset=float(offset),
    )


@register(fused_rope)
def rope(ctx, node):
    """x * cos + rotate_half(x) * sin."""
    x, cos, sin = node.args
    return ctx.emit_out("Rope", x=ctx.slot(x), cos=ctx.slot(cos), sin=ctx.slot(sin))
