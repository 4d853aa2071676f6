"""Value types of the KV cache: the error, a layer's geometry and a session's policy."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


class CacheError(ValueError):
    """A step, trim or policy a store cannot honour; the store is left unchanged."""


@dataclass(frozen=True)
class LayerGeometry:
    """Shape facts of one attention layer, from the graph file's metadata."""

    layer_id: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    sliding_window: int  # 0 = full attention
    attention_chunk: int = 0  # C > 0: a query sees only its own chunk of C positions


@dataclass(frozen=True)
class CachePolicy:
    """How a session wants one layer's history stored (see module docstring)."""

    capacity: int
    kv_dtype: mx.Dtype | None
    preallocate: bool = False
    window: int = 0
    max_step: int = 1
    kv_bits: int = 0  # 0 = store k/v as floats; 4 or 8 = group-wise affine quantized
    kv_group_size: int = 64  # elements per quantization group (along the head dim)
