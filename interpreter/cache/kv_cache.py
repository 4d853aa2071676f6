"""Off-graph KV cache: public entry point (one store per attention layer, per session).

See ``cache_store`` for the step protocol (begin / update / commit | rollback) and the
flat and ring stores, ``cache_layout`` for the slot buffers and masks.
"""

from __future__ import annotations

import mlx.core as mx

from mlxgraph.interpreter.cache.kv_codec import quantization_problem
from mlxgraph.interpreter.cache.store import FlatStore, KVStore, RingStore, stored_dims
from mlxgraph.interpreter.cache.types import CacheError, CachePolicy
from mlxgraph.schema.records import LayerCacheInfo

__all__ = [
    "CacheError",
    "CachePolicy",
    "FlatStore",
    "KVStore",
    "LayerCacheInfo",
    "RingStore",
    "make_store",
]

_STORAGE_DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def make_store(geometry: LayerCacheInfo, policy: CachePolicy) -> KVStore:
    """Create the store a policy asks for, for one layer.

    Args:
        geometry: the layer's head counts, head dims and model sliding window.
        policy: capacity, storage dtype or quantization bits, flat (window 0) or ring,
            max_step hint.

    Returns:
        A ``FlatStore`` (``policy.window == 0``) or a ``RingStore``. The store applies the
        model's sliding window if the layer has one, else (ring on a full-attention
        layer, an explicit approximation) ``policy.window``. A chunked-attention layer
        always gets a ring of one chunk (exact, whatever the policy).

    Raises:
        CacheError: a non-positive size, an unsupported storage dtype, quantization the
            layer cannot take (bits, group size, head dims; kv_bits with a kv_dtype), or a
            ring window smaller than the layer's own sliding window (it would drop needed keys).
    """
    g, p = geometry, policy
    where = f"layer {g.layer_id}"
    for name in ("kv_heads", "head_dim", "v_head_dim"):
        if getattr(g, name) < 1:
            raise CacheError(f"{where}: {name} must be >= 1, got {getattr(g, name)}")
    if g.values_in_keys and g.v_head_dim > g.head_dim:
        raise CacheError(f"{where}: values in keys, but v_head_dim {g.v_head_dim} is wider "
                         f"than head_dim {g.head_dim}")
    if g.sliding_window < 0 or p.window < 0:
        raise CacheError(f"{where}: windows must be >= 0 (0 = full), got {g.sliding_window}, "
                         f"{p.window}")
    if p.max_step < 1:
        raise CacheError(f"{where}: max_step must be >= 1, got {p.max_step}")
    if p.kv_dtype is not None and p.kv_dtype not in _STORAGE_DTYPES:
        raise CacheError(f"{where}: kv_dtype must be None, float32, float16 or bfloat16, got "
                         f"{p.kv_dtype}")
    if p.kv_bits:
        if p.kv_dtype is not None:
            raise CacheError(f"{where}: kv_bits={p.kv_bits} stores codes, it cannot also take "
                             f"kv_dtype {p.kv_dtype}")
        problem = quantization_problem(stored_dims(g), p.kv_bits, p.kv_group_size)
        if problem:
            raise CacheError(f"{where}: {problem}")
    if g.attention_chunk < 0:
        raise CacheError(f"{where}: attention_chunk must be >= 0 (0 = none), "
                         f"got {g.attention_chunk}")
    if g.attention_chunk:
        # A query sees at most its own chunk: one chunk of history is all the layer needs,
        # whatever the policy asks of full-attention layers.
        return RingStore(g, p, slots=g.attention_chunk + p.max_step - 1, window=g.attention_chunk)
    if p.window == 0:
        if p.capacity < 1:
            raise CacheError(f"{where}: a flat cache needs capacity >= 1, got {p.capacity}")
        return FlatStore(g, p, slots=p.capacity, window=g.sliding_window)
    if g.sliding_window and p.window < g.sliding_window:
        raise CacheError(
            f"{where}: ring window {p.window} is smaller than the layer's sliding window "
            f"{g.sliding_window}; use window >= {g.sliding_window} or a flat cache (window 0)"
        )
    return RingStore(g, p, slots=p.window + p.max_step - 1, window=g.sliding_window or p.window)
