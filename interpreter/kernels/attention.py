"""The UpdateAndAttend kernel: the cache places K/V, this side owns the query."""

import mlx.core as mx

from mlxgraph.interpreter.attention import attend
from mlxgraph.interpreter.kernels import register


@register("UpdateAndAttend", needs_context=True)
def update_and_attend(q, k, v, position, sinks, layer_id, scale, out_dtype, softcap, ctx):
    """Write this step's K/V into the layer's store and attend over its window.

    ``position`` is not read: the session knows the step's host positions and has already
    checked them against the cache, so nothing here forces an evaluation. In a batched
    step (``ctx.rows``) the token axis holds several sessions' tokens one after another:
    each row's slice goes to its own store and attends over its own history only, with
    exactly the calls a step of that session alone would make.
    """
    dtype = out_dtype if out_dtype is not None else q.dtype
    if ctx.rows is None:
        keys, values, mask = ctx.store(layer_id).update(k, v)
        return attend(q, keys, values, mask, scale, dtype, sinks=sinks, softcap=softcap or 0.0)
    total = sum(n for _, _, n in ctx.rows)
    if q.shape[2] != total or k.shape[2] != total or v.shape[2] != total:
        raise ValueError(f"UpdateAndAttend: a batched step of {total} tokens, got q {q.shape}, "
                         f"k {k.shape}, v {v.shape} (tokens on axis 2)")
    outs = []
    for stores, start, n in ctx.rows:
        rows = slice(start, start + n)
        keys, values, mask = stores[layer_id].update(k[:, :, rows], v[:, :, rows])
        outs.append(attend(q[:, :, rows], keys, values, mask, scale, dtype, sinks=sinks,
                           softcap=softcap or 0.0))
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
