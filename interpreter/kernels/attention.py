"""The UpdateAndAttend kernel: the cache places K/V, this side owns the query."""

import mlx.core as mx

from mlxgraph.interpreter.attention import attend
from mlxgraph.interpreter.kernels import register


@register("UpdateAndAttend", needs_context=True)
def update_and_attend(q, k, v, position, sinks, layer_id, scale, out_dtype, softcap,
                      alibi_slopes, ctx):
    """Write this step's K/V into the layer's store and attend over its window.

    ``position`` is not read: the session knows the step's host positions and has already
    checked them against the cache, so nothing here forces an evaluation. In a batched
    step (``ctx.rows``) the token axis holds several sessions' tokens one after another:
    each row's slice goes to its own store and attends over its own history only, with
    exactly the calls a step of that session alone would make. ALiBi's distances (format
    1.3) come from the store, which knows where each key it returned sits.
    """
    dtype = out_dtype if out_dtype is not None else q.dtype
    slopes = None if alibi_slopes is None else mx.array(alibi_slopes, dtype=mx.float32)

    def run(store, q, k, v):
        keys, values, mask = store.update(k, v)
        alibi = None if slopes is None else (slopes, store.relative_positions())
        return attend(q, keys, values, mask, scale, dtype, sinks=sinks, softcap=softcap or 0.0,
                      alibi=alibi)

    if ctx.rows is None:
        return run(ctx.store(layer_id), q, k, v)
    total = sum(n for _, _, n in ctx.rows)
    if q.shape[2] != total or k.shape[2] != total or v.shape[2] != total:
        raise ValueError(f"UpdateAndAttend: a batched step of {total} tokens, got q {q.shape}, "
                         f"k {k.shape}, v {v.shape} (tokens on axis 2)")
    outs = []
    for stores, start, n in ctx.rows:
        rows = slice(start, start + n)
        outs.append(run(stores[layer_id], q[:, :, rows], k[:, :, rows], v[:, :, rows]))
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
