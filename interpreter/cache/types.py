"""Value types of the KV cache: the error and a session's policy.

A layer's geometry is the graph file's own record, schema.records.LayerCacheInfo.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlxgraph.schema.errors import Error


class CacheError(Error, ValueError):
    """A step, trim or policy a store cannot honour; the store is left unchanged."""


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
