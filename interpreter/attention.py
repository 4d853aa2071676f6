"""Attention core: the queries of one step against what the KV store returned.

GQA is native: K/V keep their ``Hkv`` heads and MLX's fused scaled-dot-product attention
groups the ``Hq / Hkv`` query heads that share each one, so K/V are never repeated.
"""

from __future__ import annotations

import mlx.core as mx

from mlxgraph.interpreter.cache_layout import Mask


def attend(
    q: mx.array, keys: mx.array, values: mx.array, mask: Mask, scale: float, out_dtype: mx.Dtype
) -> mx.array:
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
    out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)
    return out if out.dtype == out_dtype else out.astype(out_dtype)
