"""Attention core: the queries of one step against what the KV store returned.

GQA is native: K/V keep their ``Hkv`` heads and MLX's fused scaled-dot-product attention
groups the ``Hq / Hkv`` query heads that share each one, so K/V are never repeated.
Attention sinks go through the fused kernel too (its ``sinks=``). Logit softcapping
changes the scores between the product and the softmax, which the fused kernel cannot
do, so a softcapped layer takes the explicit path (:func:`_attend_softcapped`).
"""

from __future__ import annotations

import math

import mlx.core as mx

from mlxgraph.interpreter.cache_layout import Mask


def attend(q: mx.array, keys: mx.array, values: mx.array, mask: Mask, scale: float,
           out_dtype: mx.Dtype, sinks: mx.array | None = None, softcap: float = 0.0) -> mx.array:
    """Scaled dot-product attention of a step's queries over the cached keys/values.

    Args:
        q: ``[B, Hq, T, D]`` queries (RoPE applied).
        keys: ``[B, Hkv, S, D]``; ``Hq`` must be a multiple of ``Hkv``.
        values: ``[B, Hkv, S, Dv]``; ``Dv`` may differ from ``D``.
        mask: None (every query sees every key), ``"causal"`` (lower-right aligned:
            query i sees keys ``0 .. S-T+i``) or a bool array broadcastable to
            ``[T, S]`` (True = may attend), as returned by ``KVStore.update``.
        scale: multiplier of ``q @ k^T``, usually ``D ** -0.5``.
        out_dtype: dtype of the result.
        sinks: None or ``[Hq]`` sink logits: one extra softmax column per query head,
            dropped from the output (gpt-oss).
        softcap: 0 (none) or c > 0: ``scores = tanh(scores / c) * c`` before the mask.

    Returns:
        ``[B, Hq, T, Dv]`` in ``out_dtype`` (lazy). The softmax runs in float32.

    Raises:
        ValueError: shapes that do not fit together, or an unknown mask kind.
    """
    if q.ndim != 4 or keys.ndim != 4 or values.ndim != 4:
        raise ValueError(
            f"attend: q, keys, values must be 4-D, got {q.shape}, {keys.shape}, {values.shape}"
        )
    b, hq, t, d = q.shape
    bk, hkv, s, dk = keys.shape
    if bk != b or values.shape[0] != b:
        raise ValueError(
            f"attend: batch mismatch: q {q.shape}, keys {keys.shape}, values {values.shape}"
        )
    if hkv == 0 or hq % hkv or values.shape[1] != hkv:
        raise ValueError(
            f"attend: {hq} query heads must be a multiple of the {hkv} key/value heads (values "
            f"have {values.shape[1]})"
        )
    if dk != d:
        raise ValueError(f"attend: query head dim {d} != key head dim {dk}")
    if values.shape[2] != s:
        raise ValueError(f"attend: {s} keys but {values.shape[2]} values")
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"attend: the only string mask is 'causal', got {mask!r}")
        if t > s:
            raise ValueError(
                f"attend: causal mask needs at least as many keys ({s}) as queries ({t})"
            )
    elif mask is not None and mask.shape[-2:] != (t, s):
        raise ValueError(f"attend: mask shape {mask.shape} does not end in [T, S] = [{t}, {s}]")
    if sinks is not None:
        if sinks.shape != (hq,):
            raise ValueError(f"attend: sinks must have shape [{hq}] (one per query head), "
                             f"got {sinks.shape}")
        sinks = sinks.astype(q.dtype)
    if softcap:
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"attend: softcap must be a positive finite number (0 = none), "
                             f"got {softcap}")
        out = _attend_softcapped(q, keys, values, mask, scale, sinks, softcap)
    else:
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask,
                                                   sinks=sinks)
    return out if out.dtype == out_dtype else out.astype(out_dtype)


def _attend_softcapped(q, keys, values, mask: Mask, scale: float, sinks, softcap: float):
    """Attention with ``tanh(scores / c) * c`` scores, written out (float32 scores).

    The query heads sharing a K/V head are grouped on a new axis so K/V are not repeated.
    """
    b, hq, t, d = q.shape
    hkv, s, dv = keys.shape[1], keys.shape[2], values.shape[3]
    group = hq // hkv
    qg = q.reshape(b, hkv, group, t, d).astype(mx.float32)
    # [B, Hkv, G, T, S]
    scores = (qg * scale) @ keys[:, :, None].astype(mx.float32).swapaxes(-1, -2)
    scores = mx.tanh(scores / softcap) * softcap
    if isinstance(mask, str):      # "causal", lower-right aligned
        mask = mx.arange(s)[None, :] <= mx.arange(s - t, s)[:, None]
    if mask is not None:
        scores = mx.where(mask, scores, -mx.inf)
    if sinks is not None:
        column = sinks.astype(mx.float32).reshape(1, hkv, group, 1, 1)
        column = mx.broadcast_to(column, (b, hkv, group, t, 1))
        scores = mx.concatenate([scores, column], axis=-1)
    probs = mx.softmax(scores, axis=-1, precise=True)[..., :s].astype(values.dtype)
    out = probs @ values[:, :, None]                                    # [B, Hkv, G, T, Dv]
    return out.reshape(b, hq, t, dv)
