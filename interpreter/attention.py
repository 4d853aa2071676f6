"""Attention core: the queries of one step against what the KV store returned.

GQA is native: K/V keep their ``Hkv`` heads and the ``Hq / Hkv`` query heads that share
each one are grouped, so K/V are never repeated. Two paths:

- explicit (:func:`_attend_explicit`): float32 scores by one matrix product per K/V head,
  the softmax, then one product with V. Float32 attention on the CPU takes it with the
  native masked softmax (interpreter/native/activations.py): MLX's CPU fused attention
  falls back to its own ops, whose softmax calls the x86-64 wheel's scalar exp (6 of the
  7.6 ms of a 128-token, 16-head causal attention). A softcapped layer takes it too
  (``tanh(scores / c) * c`` sits between the product and the softmax), and so does an ALiBi
  layer (``slope[h] * (s - p)`` added to the float32 scores, so the bias is never rounded
  to a half-precision mask), with MLX's softmax when the native one is not available.
- MLX's fused ``mx.fast.scaled_dot_product_attention`` (sinks included) for everything else:
  other dtypes, additive masks, ``MLXGRAPH_NATIVE_ACTIVATIONS=0``, no native build.
"""

from __future__ import annotations

import math

import mlx.core as mx

from mlxgraph.interpreter.cache.layout import Mask
from mlxgraph.interpreter.native.activations import native_for


def attend(q: mx.array, keys: mx.array, values: mx.array, mask: Mask, scale: float,
           out_dtype: mx.Dtype, sinks: mx.array | None = None, softcap: float = 0.0,
           alibi: tuple | None = None) -> mx.array:
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
        alibi: None or ``(slopes [Hq] float32, distance [T, S] int)``: each score gains
            ``slopes[h] * distance[i, j]`` (key position minus query position) after
            softcapping, before the mask.

    Returns:
        ``[B, Hq, T, Dv]`` in ``out_dtype`` (lazy). The softmax runs in float32.

    Raises:
        ValueError: shapes that do not fit together, or an unknown mask kind.
    """
    qs, ks, vs = q.shape, keys.shape, values.shape  # (each read builds a new tuple)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise ValueError(f"attend: q, keys, values must be 4-D, got {qs}, {ks}, {vs}")
    b, hq, t, d = qs
    bk, hkv, s, dk = ks
    if bk != b or vs[0] != b:
        raise ValueError(f"attend: batch mismatch: q {qs}, keys {ks}, values {vs}")
    if hkv == 0 or hq % hkv or vs[1] != hkv:
        raise ValueError(
            f"attend: {hq} query heads must be a multiple of the {hkv} key/value heads (values "
            f"have {vs[1]})"
        )
    if dk != d:
        raise ValueError(f"attend: query head dim {d} != key head dim {dk}")
    if vs[2] != s:
        raise ValueError(f"attend: {s} keys but {vs[2]} values")
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
    if softcap and not (math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"attend: softcap must be a positive finite number (0 = none), "
                         f"got {softcap}")
    if alibi is not None and (alibi[0].shape != (hq,) or alibi[1].shape != (t, s)):
        raise ValueError(f"attend: ALiBi needs [{hq}] slopes and [{t}, {s}] distances, got "
                         f"{alibi[0].shape} and {alibi[1].shape}")
    native = native_for(q, keys, values)
    if mask is not None and not isinstance(mask, str) and mask.dtype != mx.bool_:
        native = None  # an additive mask: MLX's fused kernel adds it
    if softcap or alibi is not None or native is not None:
        out = _attend_explicit(q, keys, values, mask, scale, sinks, softcap, native, alibi,
                               (b, hq, t, d, hkv, s, vs[3]))
    else:
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask,
                                                   sinks=sinks)
    return out if out.dtype == out_dtype else out.astype(out_dtype)


def _attend_explicit(q, keys, values, mask: Mask, scale: float, sinks, softcap: float, native,
                     alibi, dims):
    """Attention written out: float32 scores (softcapped if ``softcap``, ALiBi's bias
    added if ``alibi``; ``dims``: B, Hq, T, D, Hkv, S, Dv), the masked softmax
    (``native``'s primitive, or MLX's ops when None), then the product with V.

    The query heads sharing a K/V head are adjacent rows of one product (``[B, Hkv, G*T, D]``
    against ``[B, Hkv, S, D]``), so K/V are not repeated and each product is as tall as it
    can be.
    """
    b, hq, t, d, hkv, s, dv = dims  # (B, Hq, T, D, Hkv, S, Dv), as attend read them
    rows = hq // hkv * t
    qg = q.astype(mx.float32).reshape(b, hkv, rows, d)
    scores = (qg * scale) @ keys.astype(mx.float32).swapaxes(-1, -2)      # [B, Hkv, G*T, S]
    if softcap:
        scores = mx.tanh(scores / softcap) * softcap
    scores = scores.reshape(b, hq, t, s)
    if alibi is not None:
        slopes, distance = alibi
        scores = scores + slopes.reshape(1, hq, 1, 1) * distance.astype(mx.float32)
    if native is not None:
        array_mask = None if mask is None or isinstance(mask, str) else mask
        probs = native.attention_softmax(scores, isinstance(mask, str), array_mask, sinks)
    else:
        probs = _softmax_mlx(scores, mask, sinks)
    probs = probs.astype(values.dtype).reshape(b, hkv, rows, s)
    return (probs @ values).reshape(b, hq, t, dv)


def _softmax_mlx(scores, mask: Mask, sinks):
    """The masked softmax (with the sink column) of ``[B, Hq, T, S]`` scores by MLX's ops."""
    b, hq, t, s = scores.shape
    if isinstance(mask, str):      # "causal", lower-right aligned
        mask = mx.arange(s)[None, :] <= mx.arange(s - t, s)[:, None]
    if mask is not None:
        scores = mx.where(mask, scores, -mx.inf)
    if sinks is not None:
        column = mx.broadcast_to(sinks.astype(mx.float32).reshape(1, hq, 1, 1), (b, hq, t, 1))
        scores = mx.concatenate([scores, column], axis=-1)
    return mx.softmax(scores, axis=-1, precise=True)[..., :s]
