"""``mx.dequantize`` of MLX's affine packed codes, bit for bit, in a fraction of its nodes.

MLX's CPU dequantize builds ~50 graph nodes per call (each code cut out of its word by its
own shift pair, the pieces concatenated, then ``code * scale + bias``), and every node
costs the host time to build and to dispatch: on a one-token decode step of a small model
the embedding's dequantize alone was ~40 of the step's ~280 nodes (and a quantized KV
cache dequantizes twice per layer). Here the codes are cut out by one shift of every word
by every code's offset and one mask, ~12 nodes; the float part is the same float32
product then sum, so the values are MLX's exactly (tests/test_dequantize.py).
"""

import mlx.core as mx

# Each code's shift in its uint32 word, the first code lowest (MLX's packing), and the
# code mask, for the widths whose codes never straddle two words. Arrays made once (a
# Python scalar would be a new array and a broadcast node per call), evaluated now as
# every constant a step reads is (a lazy one would be waited on by every thread).
_SHIFTS = {b: (mx.array(list(range(0, 32, b)), dtype=mx.uint32),
               mx.array((1 << b) - 1, dtype=mx.uint32)) for b in (2, 4, 8)}
mx.eval(*_SHIFTS.values())


def dequantize(packed, scales, biases, group_size: int, bits: int):
    """``mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits)``.

    Args:
        packed: ``[..., words]`` uint32 codes; scales, biases: ``[..., groups]``.
    Returns:
        ``[..., words * 32 / bits]`` in the scales' dtype, the values MLX's dequantize
        gives. Anything else goes to MLX's own, errors included: other widths or dtypes,
        shapes that do not fit, and any device but the CPU (where MLX's dequantize is one
        fused kernel, not a chain of nodes).
    """
    *lead, words = packed.shape
    width = words * 32 // bits if bits in _SHIFTS else 0
    groups = width // group_size if width and group_size > 0 else 0
    if (not groups or groups * group_size != width or packed.dtype != mx.uint32
            or scales.shape != (*lead, groups) or biases.shape != scales.shape
            or biases.dtype != scales.dtype or not mx.issubdtype(scales.dtype, mx.floating)
            or mx.default_device() != mx.cpu):
        return mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits)
    shifts, mask = _SHIFTS[bits]
    codes = mx.bitwise_and(mx.right_shift(mx.expand_dims(packed, -1), shifts), mask)
    codes = codes.reshape(*lead, groups, group_size).astype(scales.dtype)
    rows = mx.add(mx.multiply(codes, mx.expand_dims(scales, -1)), mx.expand_dims(biases, -1))
    return rows.reshape(*lead, width)
