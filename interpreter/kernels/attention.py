"""The UpdateAndAttend kernel: the cache places K/V, this side owns the query."""

from mlxgraph.interpreter.attention import attend
from mlxgraph.interpreter.kernels import register


@register("UpdateAndAttend", needs_context=True)
def update_and_attend(q, k, v, position, sinks, layer_id, scale, out_dtype, softcap, ctx):
    """Write this step's K/V into the layer's store and attend over its window.

    ``position`` is not read: the session knows the step's host positions and has already
    checked them against the cache, so nothing here forces an evaluation.
    """
    keys, values, mask = ctx.store(layer_id).update(k, v)
    return attend(q, keys, values, mask, scale, out_dtype if out_dtype is not None else q.dtype,
                  sinks=sinks, softcap=softcap or 0.0)
