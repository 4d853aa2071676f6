"""How a KV store holds one token's key or value row: as floats, or quantized.

A store keeps K (and V, unless its values are a prefix of its keys: latent attention) in one
slot buffer ``[B, H, A, W]`` and moves whole slots around
(writes, ring rotation, growth, save). A codec turns a step's ``[B, H, T, D]`` rows into
stored rows of width ``W`` and back, so the slot mechanics never see what a row holds.

``FloatCodec`` stores the row in the storage dtype (``W = D``). ``QuantizedCodec`` stores
it group-wise affine quantized with ``mx.quantize`` and packs each row into one uint32
row: ``D * bits / 32`` words of codes, then the ``D / group`` scales and ``D / group``
biases as float32 bit patterns. One array per buffer keeps a quantized store on the same
slot path as a float one (in place writes, wrap, trim, fork, save all unchanged).
"""

from __future__ import annotations

import mlx.core as mx

from mlxgraph.interpreter.dequantize import dequantize

QUANT_BITS = (4, 8)
QUANT_GROUP_SIZES = (32, 64, 128)


class FloatCodec:
    """Rows stored as floats in the storage dtype (the compute dtype when it is None)."""

    bits = 0

    def __init__(self, dims: tuple, kv_dtype: mx.Dtype | None):
        self.widths = tuple(dims)
        self.storage_dtype = kv_dtype

    def encode(self, x: mx.array, dtype: mx.Dtype) -> mx.array:
        """``x`` in the storage dtype ``dtype``."""
        return x if x.dtype == dtype else x.astype(dtype)

    def decode(self, rows: mx.array, which: int, compute: mx.Dtype) -> mx.array:
        """Stored rows back in the compute dtype (``which``: 0 keys, 1 values)."""
        return rows if rows.dtype == compute else rows.astype(compute)


class QuantizedCodec:
    """Rows stored as ``bits``-bit codes with a float32 scale and bias per group."""

    storage_dtype = mx.uint32

    def __init__(self, dims: tuple, bits: int, group_size: int):
        self.bits, self.group_size = bits, group_size
        self.dims = tuple(dims)
        self.widths = tuple(packed_width(d, bits, group_size) for d in self.dims)

    def encode(self, x: mx.array, dtype: mx.Dtype) -> mx.array:
        """Quantize ``[..., D]`` rows (in float32, so scales are float32) and pack them."""
        codes, scales, biases = mx.quantize(
            x.astype(mx.float32), group_size=self.group_size, bits=self.bits
        )
        return mx.concatenate([codes, scales.view(mx.uint32), biases.view(mx.uint32)], axis=-1)

    def decode(self, rows: mx.array, which: int, compute: mx.Dtype) -> mx.array:
        """Packed rows back to ``[..., D]`` floats in the compute dtype."""
        codes, scales, biases = unpack(rows, self.dims[which], self.bits, self.group_size)
        out = dequantize(codes, scales, biases, self.group_size, self.bits)
        return out if out.dtype == compute else out.astype(compute)


def packed_width(dim: int, bits: int, group_size: int) -> int:
    """uint32 words per packed row of ``dim`` elements: codes, scales, biases."""
    return dim * bits // 32 + 2 * (dim // group_size)


def unpack(rows, dim: int, bits: int, group_size: int):
    """Split packed uint32 rows (mx or numpy) into (codes, float32 scales, float32 biases)."""
    n, g = dim * bits // 32, dim // group_size
    codes, scales, biases = rows[..., :n], rows[..., n : n + g], rows[..., n + g : n + 2 * g]
    if isinstance(rows, mx.array):
        return codes, scales.view(mx.float32), biases.view(mx.float32)
    return codes, scales.view("<f4"), biases.view("<f4")


def quantization_problem(dims: tuple, bits: int, group_size: int) -> str | None:
    """Why rows of these dims cannot be quantized so (None when they can)."""
    if bits not in QUANT_BITS:
        return f"kv_bits must be 0 (off), 4 or 8, got {bits}"
    if group_size not in QUANT_GROUP_SIZES:
        return f"kv_group_size must be one of {QUANT_GROUP_SIZES}, got {group_size}"
    for name, d in zip(("head_dim", "v_head_dim"), dims):
        if d % group_size:
            return f"{name} {d} is not a multiple of the quantization group size {group_size}"
    return None


def make_codec(dims: tuple, kv_dtype, kv_bits: int, group_size: int):
    """The codec a policy asks for (the policy is already validated), for rows of ``dims``:
    (head_dim, v_head_dim), or (head_dim,) for a store that keeps keys alone."""
    if kv_bits:
        return QuantizedCodec(dims, kv_bits, group_size)
    return FloatCodec(dims, kv_dtype)
