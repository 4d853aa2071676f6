"""The custom op ``mlxgraph::update_and_attend`` and its eager reference cache.

The op is functional from torch's point of view (it mutates no tensor argument), so an
exported graph holds no cache tensors: the cache is off-graph state keyed by
``layer_id`` (docs/architecture.md#the-attention-contract). Tracing uses the fake
kernel (shape and dtype only). The eager kernel appends K/V to the active reference
cache and runs masked attention, so a model rewritten to call this op still runs in torch
and serves as an oracle. The active cache is a context variable, set by its owner (one
``DecoderAdapter``, one export) around each forward: two exports in one process, or in
two threads, never share history.

Mask rule of the reference (the same one Hugging Face applies): a query at absolute
position p sees a cached key at position s when s <= p and, for a layer with a sliding
window W > 0, p - s < W, and for a chunked-attention layer (chunk C > 0), s // C == p // C.
"""

from contextlib import contextmanager
from contextvars import ContextVar

import torch

__all__ = ["update_and_attend", "ReferenceCache", "using_reference_cache",
           "active_reference_cache"]


class ReferenceCache:
    """Eager K/V history per layer_id: keys, values and their absolute positions.

    Windows (layer_id -> W, 0 = full attention) and chunks (layer_id -> C, 0 = none)
    decide the mask; K/V are kept whole, which is simple and exact for a reference.
    ``states`` holds the recurrent state of each state layer_id (exporter/state_op.py).
    """

    def __init__(self):
        self.windows = {}
        self.chunks = {}
        self.layers = {}
        self.states = {}

    def reset(self, windows: dict | None = None) -> None:
        """Forget all history; optionally set the sliding window of each layer_id."""
        self.layers = {}
        self.states = {}
        if windows is not None:
            self.windows = {int(k): int(v) for k, v in windows.items()}

    def length(self, layer_id: int) -> int:
        """Tokens cached for ``layer_id``."""
        entry = self.layers.get(layer_id)
        return 0 if entry is None else entry[2].numel()

    def append(self, layer_id: int, k, v, position):
        """Append one step's K/V ([B, H, T, D]) at ``position`` ([T, 1]); returns all of them."""
        pos = position.reshape(-1).to(torch.long)
        if layer_id in self.layers:
            k0, v0, p0 = self.layers[layer_id]
            k, v, pos = torch.cat([k0, k], 2), torch.cat([v0, v], 2), torch.cat([p0, pos])
        self.layers[layer_id] = (k, v, pos)
        return k, v, pos


_ACTIVE: ContextVar = ContextVar("mlxgraph_reference_cache", default=None)


@contextmanager
def using_reference_cache(cache: ReferenceCache):
    """Run the op's eager kernel against ``cache`` inside the ``with`` block (this context only)."""
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)


def active_reference_cache() -> ReferenceCache:
    """The reference cache the eager kernel writes to now.

    Raises:
        RuntimeError: the op ran eagerly outside ``using_reference_cache`` (or an adapter).
    """
    cache = _ACTIVE.get()
    if cache is None:
        raise RuntimeError("mlxgraph::update_and_attend ran eagerly with no reference cache: "
                           "call it inside DecoderAdapter.forward or using_reference_cache()")
    return cache


@torch.library.custom_op("mlxgraph::update_and_attend", mutates_args=())
def update_and_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    position: torch.Tensor,
    layer_id: int,
    scale: float,
    out_dtype: torch.dtype | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float = 0.0,
    value_width: int = 0,
    alibi_slopes: list[float] | None = None,
) -> torch.Tensor:
    """Append k/v to layer ``layer_id``'s cache and attend q over the cached window.

    Args:
        q: [B, Hq, T, D]; k: [B, Hkv, T, D] (already rotated); v: [B, Hkv, T, Dv];
            Hq a multiple of Hkv.
        position: [T, 1] int, the absolute position of each query token.
        layer_id: which cache; scale: the softmax scale; out_dtype: None = q's dtype.
        sinks: None or [Hq] sink logits (one extra softmax column per head, dropped).
        softcap: 0 = none; else scores = tanh(scores / softcap) * softcap before the mask.
        value_width: 0, or latent attention (MLA absorbed): v is k and the values are the
            first value_width columns of the keys (the graph's cache keeps keys alone).
        alibi_slopes: None or one slope per query head (ALiBi): each score gains
            slope * (key position - query position) after softcap, before the mask.
    Returns:
        [B, Hq, T, Dv] in out_dtype (Dv = value_width when it is set).
    """
    cache = active_reference_cache()
    keys, values, kpos = cache.append(layer_id, k, v, position)
    if value_width:
        values = keys[..., :value_width]
    qpos = position.reshape(-1).to(torch.long)
    b, hq, t, _ = q.shape
    hkv = keys.shape[1]
    if hq % hkv:
        raise ValueError(f"update_and_attend: {hq} query heads is not a multiple of {hkv} kv heads")
    group = hq // hkv
    # Grouped-query attention without repeating K/V: fold the group into the query axis.
    qf = q.float().reshape(b, hkv, group * t, q.shape[-1])
    scores = (qf @ keys.float().transpose(-1, -2)) * scale          # [B, Hkv, G*T, S]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi_slopes is not None:
        distance = (kpos[None, :] - qpos[:, None]).float()             # [T, S]
        slopes = torch.tensor(alibi_slopes, dtype=torch.float32).reshape(1, hkv, group, 1, 1)
        bias = slopes * distance                                      # [1, Hkv, G, T, S]
        scores = scores + bias.reshape(1, hkv, group * t, -1)
    visible = kpos[None, :] <= qpos[:, None]                          # [T, S]
    window = cache.windows.get(layer_id, 0)
    if window > 0:
        visible = visible & (qpos[:, None] - kpos[None, :] < window)
    chunk = cache.chunks.get(layer_id, 0)
    if chunk > 0:
        visible = visible & (kpos[None, :] // chunk == qpos[:, None] // chunk)
    visible = visible.repeat(group, 1)                                # [G*T, S]
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        column = sinks.float().reshape(1, hkv, group, 1).expand(b, hkv, group, t)
        column = column.reshape(b, hkv, group * t, 1)
        scores = torch.cat([scores, column], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., :keys.shape[2]]
    out = probs @ values.float()                                      # [B, Hkv, G*T, Dv]
    out = out.reshape(b, hq, t, values.shape[-1])
    return out.to(out_dtype or q.dtype)


@update_and_attend.register_fake
def _fake(q, k, v, position, layer_id, scale, out_dtype=None, sinks=None, softcap=0.0,
          value_width=0, alibi_slopes=None):
    b, hq, t, _ = q.shape
    return q.new_empty((b, hq, t, value_width or v.shape[-1]), dtype=out_dtype or q.dtype)
