"""Quantized weights as the tools see them (format 1.2): which constants are packed
weights, and their values dequantized with numpy, so `diff` measures a float weight against
its quantized counterpart in dequantized space."""

import numpy as np

from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.tools.numeric import _finite_max_abs, max_abs_diff, relative, storage_to_float

ROWS_PER_CHUNK = 256  # rows dequantized at a time (bounded memory on large weights)


def packed_weights(graph) -> dict:
    """{constant index of a packed weight: (scales index, biases index, bits, group_size)}."""
    const_by_slot = {c.tensor: k for k, c in enumerate(graph.constants)}
    out = {}
    for node in graph.nodes:
        if entry(node.op).has(Trait.QUANTIZED):
            f = node.fields
            ks = [const_by_slot.get(f[name]) for name in ("weight", "scales", "biases")]
            if None not in ks:
                out[ks[0]] = (ks[1], ks[2], f["bits"], f["group_size"])
    return out


def _floats(graph, k) -> np.ndarray:
    return storage_to_float(graph.constant_array(k), graph.tensors[graph.constants[k].tensor].dtype)


def dequantized_rows(graph, k, info, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of packed weight ``k`` (info from packed_weights) as float64 [rows, K]."""
    s_index, b_index, bits, group_size = info
    words = graph.constant_array(k)[lo:hi].astype(np.uint64)
    per_word = 32 // bits
    codes = np.stack([(words >> (bits * j)) & (2**bits - 1) for j in range(per_word)], -1)
    codes = codes.reshape(hi - lo, -1, group_size).astype(np.float64)
    scales = _floats(graph, s_index)[lo:hi, :, None]
    biases = _floats(graph, b_index)[lo:hi, :, None]
    return (codes * scales + biases).reshape(hi - lo, -1)


def dequantized_errors(graph_a, index_a, graph_b, index_b):
    """(max_abs, max_rel) between two constants where one or both are packed weights, in
    dequantized space; None when their dequantized shapes differ (or neither is packed)."""
    sides = []
    for graph, k in ((graph_a, index_a), (graph_b, index_b)):
        info = packed_weights(graph).get(k)
        shape = tuple(graph.tensors[graph.constants[k].tensor].shape)
        if info is not None:
            shape = (shape[0], shape[1] * 32 // info[2])
        sides.append((graph, k, info, shape))
    if sides[0][3] != sides[1][3] or len(sides[0][3]) != 2 or all(s[2] is None for s in sides):
        return None

    def rows(side, lo, hi):
        graph, k, info, _ = side
        if info is None:
            return _floats(graph, k)[lo:hi].astype(np.float64)
        return dequantized_rows(graph, k, info, lo, hi)

    max_abs, scale = 0.0, 0.0
    for lo in range(0, sides[0][3][0], ROWS_PER_CHUNK):
        hi = min(lo + ROWS_PER_CHUNK, sides[0][3][0])
        a, b = rows(sides[0], lo, hi), rows(sides[1], lo, hi)
        max_abs = max(max_abs, max_abs_diff(a, b))
        scale = max(scale, _finite_max_abs(a))
    return max_abs, relative(max_abs, scale)
