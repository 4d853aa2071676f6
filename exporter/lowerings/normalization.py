"""Layer normalization: ``aten.native_layer_norm`` (GPT-2, GPT-NeoX, Phi-2, StarCoder2, OLMo...).

The format has no LayerNorm node, and core ATen keeps ``native_layer_norm`` whole, so it
is written with the RmsNorm node through an exact identity: with ``c = x - mean(x)``,
``layer_norm(x) = c * rsqrt(mean(c^2) + eps)``, which is RmsNorm of ``c``. As torch does
on CPU, half-precision inputs are normalized in float32 and the result is cast back.
"""

import torch

from mlxgraph.exporter.lowering_pass import torch_dtype_code
from mlxgraph.exporter.lowerings import LoweringError, register
from mlxgraph.schema.records import Operand

aten = torch.ops.aten


@register(aten.native_layer_norm.default)
def native_layer_norm(ctx, node):
    """(x - mean) normalized over the last axis, times weight, plus bias: Mean, Sub, RmsNorm,
    Add (and Casts around them for half precision). Only the normalized output is produced:
    the mean and rstd outputs serve training only.

    Raises:
        LoweringError: normalized over more than the last axis.
    """
    x, normalized_shape, weight, bias, eps = node.args
    if len(normalized_shape) != 1:
        raise LoweringError(f"layer norm over {len(normalized_shape)} axes (only the last axis is supported)")
    out_val = ctx.val(node)[0]
    f32 = out_val.to(torch.float32)
    axis = len(ctx.shape(x)) - 1
    name = node.name
    xs = ctx.slot(x)
    if out_val.dtype != torch.float32:
        xs = ctx.emit_out("Cast", val=f32, name=f"{name}_x32", x=xs, dtype=torch_dtype_code(torch.float32)).index
    mean_val = f32.mean(-1, keepdim=True)
    mean = ctx.emit_out("Mean", val=mean_val, name=f"{name}_mean", x=xs, axes=[axis], keepdims=True)
    centered = ctx.emit_out("Sub", val=f32, name=f"{name}_centered", a=Operand.tensor(xs), b=Operand.tensor(mean.index))
    y = ctx.emit_out("RmsNorm", val=f32, name=f"{name}_normed", x=centered.index,
                     weight=None if weight is None else ctx.slot(weight), eps=float(eps), weight_offset=0.0)
    if bias is not None:
        y = ctx.emit_out("Add", val=f32, name=f"{name}_biased", a=Operand.tensor(y.index), b=ctx.operand(bias))
    if out_val.dtype != torch.float32:
        y = ctx.emit_out("Cast", val=out_val, name=name, x=y.index, dtype=torch_dtype_code(out_val.dtype))
    return [y, None, None]
