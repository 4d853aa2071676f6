"""Error measures and dtype-aware tolerances shared by diff (constants) and compare (activations).

Both report two figures for a pair of same-shaped tensors a (reference) and b:

- ``max_abs``: max |a - b| over elements (positions where both are NaN, or both the same
  infinity, count as equal; a NaN or infinity on one side only makes it infinite);
- ``max_rel``: max_abs / max |a| over a's finite elements (a norm-relative error: it does
  not blow up on elements that are near zero, as an element-wise ratio would).
"""

import math

import numpy as np

from mlxgraph.schema.dtypes import dtype_info

# Relative tolerance per dtype, applied to the less precise of the two sides. About 850
# float32 ulps, 10 float16 ulps and 6 bfloat16 ulps: room for reordered accumulations
# through a few thousand ops, tight enough that a wrong weight or a wrong op shows.
RTOL = {"float64": 1e-6, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
PRECISION_ORDER = ("float64", "float32", "float16", "bfloat16")


def least_precise(dtypes):
    """The least precise floating dtype name among ``dtypes`` (None when there is none)."""
    floats = [d for d in dtypes if d in RTOL]
    return max(floats, key=PRECISION_ORDER.index) if floats else None


def tolerance(dtype_a, dtype_b, override=None, upstream=()) -> float:
    """The relative tolerance for comparing one output of two runs (0 for integers and bools).

    Args:
        dtype_a, dtype_b: the output's dtype names on each side.
        override: a user-given relative tolerance for floating outputs, or None.
        upstream: dtype names the output depends on (see compare_run.precision): a float32
            value computed from float16 weights carries float16 error.
    """
    if dtype_a not in RTOL and dtype_b not in RTOL:
        return 0.0
    if override is not None:
        return float(override)
    return RTOL[least_precise((dtype_a, dtype_b, *upstream))]


def storage_to_float(array: np.ndarray, dtype_name: str) -> np.ndarray:
    """A constant's storage array as float32 (bfloat16 bit patterns widened) or float64 (ints)."""
    if dtype_name == "bfloat16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    if dtype_info(dtype_name).is_float and dtype_name != "float64":
        return array.astype(np.float32, copy=False)
    return array.astype(np.float64, copy=False)


def _finite_max_abs(x: np.ndarray) -> float:
    ax = np.abs(x)
    m = float(ax.max()) if ax.size else 0.0
    if math.isfinite(m):
        return m
    ax = ax[np.isfinite(ax)]
    return float(ax.max()) if ax.size else 0.0


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| with the NaN/infinity rules of the module docstring."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a - b)
        m = float(d.max()) if d.size else 0.0
        if math.isfinite(m):
            return m  # the common case: no NaN or infinity anywhere
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        d[same] = 0.0
        d[np.isnan(d)] = math.inf
        return float(d.max())


def relative(max_abs: float, scale: float) -> float:
    """max_abs / scale, with 0/0 = 0 and x/0 = inf."""
    if max_abs == 0:
        return 0.0
    return max_abs / scale if scale > 0 else math.inf


def constant_errors(graph_a, index_a, graph_b, index_b, chunk: int = 1 << 22) -> tuple:
    """(max_abs, max_rel) between two same-shaped constants, read in chunks (bounded memory)."""
    ta = graph_a.tensors[graph_a.constants[index_a].tensor]
    tb = graph_b.tensors[graph_b.constants[index_b].tensor]
    a = graph_a.constant_array(index_a).reshape(-1)
    b = graph_b.constant_array(index_b).reshape(-1)
    max_abs, scale = 0.0, 0.0
    for start in range(0, a.size, chunk):
        xa = storage_to_float(a[start:start + chunk], ta.dtype)
        xb = storage_to_float(b[start:start + chunk], tb.dtype)
        max_abs = max(max_abs, max_abs_diff(xa, xb))
        scale = max(scale, _finite_max_abs(xa))
    return max_abs, relative(max_abs, scale)
