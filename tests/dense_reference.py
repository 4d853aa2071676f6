"""Dense float64 attention oracle for the KV cache tests (numpy only, no MLX)."""

from __future__ import annotations

import numpy as np


class History:
    """The true k/v history of one layer, as the store should hold it (storage-rounded)."""

    def __init__(self, kv_heads: int, head_dim: int, v_head_dim: int, batch: int):
        self.keys = np.zeros((batch, kv_heads, 0, head_dim))
        self.values = np.zeros((batch, kv_heads, 0, v_head_dim))

    @property
    def length(self) -> int:
        """Tokens in the history."""
        return self.keys.shape[2]

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Add ``[B, H, T, D]`` keys and values at the end."""
        self.keys = np.concatenate([self.keys, k.astype(np.float64)], axis=2)
        self.values = np.concatenate([self.values, v.astype(np.float64)], axis=2)

    def trim(self, n: int) -> None:
        """Drop the last ``n`` tokens."""
        keep = self.length - n
        self.keys, self.values = self.keys[:, :, :keep], self.values[:, :, :keep]


def dense_attention(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, window: int, scale: float,
    chunk: int = 0, sinks: np.ndarray | None = None, softcap: float = 0.0,
) -> np.ndarray:
    """Attention of the last ``T`` positions over the whole history, in float64.

    Args:
        q: ``[B, Hq, T, D]`` queries for positions ``S-T .. S-1``.
        keys: ``[B, Hkv, S, D]`` full history including this step.
        values: ``[B, Hkv, S, Dv]``.
        window: 0 = causal over everything; else query p sees keys j with p-window < j <= p.
        scale: score multiplier.
        chunk: 0 = none; else query p sees only keys j with j // chunk == p // chunk.
        sinks: None or ``[Hq]`` sink logits (an extra softmax column per head, dropped).
        softcap: 0 = none; else scores = tanh(scores / softcap) * softcap before the mask.

    Returns:
        ``[B, Hq, T, Dv]`` float64.
    """
    b, hq, t, d = q.shape
    hkv, s = keys.shape[1], keys.shape[2]
    group = hq // hkv
    qg = q.astype(np.float64).reshape(b, hkv, group, t, d)
    scores = np.einsum("bhgtd,bhsd->bhgts", qg, keys) * scale
    if softcap:
        scores = np.tanh(scores / softcap) * softcap
    qpos = np.arange(s - t, s)[:, None]
    kpos = np.arange(s)[None, :]
    allowed = kpos <= qpos
    if window:
        allowed &= kpos > qpos - window
    if chunk:
        allowed &= kpos // chunk == qpos // chunk
    scores = np.where(allowed, scores, -np.inf)
    if sinks is not None:
        column = sinks.astype(np.float64).reshape(1, hkv, group, 1, 1)
        column = np.broadcast_to(column, (b, hkv, group, t, 1))
        scores = np.concatenate([scores, column], axis=-1)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    out = np.einsum("bhgts,bhsv->bhgtv", weights[..., :s], values)
    return out.reshape(b, hq, t, values.shape[-1])
