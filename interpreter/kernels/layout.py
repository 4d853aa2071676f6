"""Shape and layout kernels: reshape, permute, expand, slice, select, concat, squeeze,
unsqueeze, split and cast, with torch semantics.

Shape-like Operands (reshape/expand sizes, slice bounds) must be host ints: value slots
or literals. A tensor there would need an evaluation, so it is rejected.
"""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register
from mlxgraph.interpreter.kernels.symbolic import static_int, static_ints


def _axis(axis: int, ndim: int, op: str) -> int:
    """A non-negative axis, checked against ndim."""
    if not -ndim <= axis < ndim:
        raise IndexError(f"{op}: axis {axis} out of range for a tensor of rank {ndim}")
    return axis % ndim


@register("Reshape")
def reshape(x, shape):
    """x viewed as ``shape`` (one entry may be -1)."""
    return mx.reshape(x, static_ints(shape, "Reshape", "shape"))


@register("Permute")
def permute(x, perm):
    """Axes of x reordered by ``perm`` (negative entries count from the end)."""
    try:
        return mx.transpose(x, perm)  # MLX reads negative axes as _axis does
    except (IndexError, ValueError):
        return mx.transpose(x, [_axis(p, x.ndim, "Permute") for p in perm])  # our message


@register("Expand")
def expand(x, shape):
    """x broadcast to ``shape``; -1 keeps x's size on that axis (torch.expand).

    Raises:
        ValueError: shape has fewer axes than x, or -1 on a new leading axis.
    """
    sizes = static_ints(shape, "Expand", "shape")
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ValueError(f"Expand: shape {sizes} has fewer axes than x {tuple(x.shape)}")
    for i, s in enumerate(sizes):
        if s == -1:
            if i < lead:
                raise ValueError(f"Expand: -1 is not allowed on new leading axis {i}")
            sizes[i] = x.shape[i - lead]
    return mx.broadcast_to(x, sizes)


@register("Slice")
def slice_(x, start=None, end=None, axis=0, step=1):
    """x[start:end:step] on ``axis``, bounds clamped like Python/torch (end may be huge,
    negative bounds count from the end, absent bounds mean the whole axis).

    Raises:
        ValueError: step < 1. IndexError: axis out of range.
    """
    if step < 1:
        raise ValueError(f"Slice: step must be >= 1, got {step}")
    ax = _axis(axis, x.ndim, "Slice")
    lo = None if start is None else static_int(start, "Slice", "start")
    hi = None if end is None else static_int(end, "Slice", "end")
    lo, hi, _ = slice(lo, hi, step).indices(x.shape[ax])
    hi = max(hi, lo)
    if lo == 0 and hi == x.shape[ax] and step == 1:
        return x
    return x[(slice(None),) * ax + (slice(lo, hi, step),)]


@register("Select")
def select(x, index, axis=0):
    """x[..., index, ...] on ``axis``, dropping that axis (index may be negative or a 0-d tensor).

    Raises:
        IndexError: a host index out of range, or axis out of range.
    """
    ax = _axis(axis, x.ndim, "Select")
    if isinstance(index, mx.array):
        # A device-side index: take keeps it lazy (no evaluation).
        return mx.take(x, index.reshape(()), axis=ax)
    i = static_int(index, "Select", "index")
    n = x.shape[ax]
    if not -n <= i < n:
        raise IndexError(f"Select: index {i} out of range for axis {axis} of size {n}")
    return x[(slice(None),) * ax + (i % n,)]


@register("Concat")
def concat(inputs, axis=0):
    """The inputs joined along ``axis`` (dtypes promote as in torch.cat)."""
    return mx.concatenate(list(inputs), axis=axis)


@register("Squeeze")
def squeeze(x, axes=None):
    """x without the listed size-1 axes (axes of another size are kept, as torch does);
    all size-1 axes when ``axes`` is absent or empty."""
    if axes:
        picked = {_axis(a, x.ndim, "Squeeze") for a in axes}
    else:
        picked = set(range(x.ndim))
    drop = sorted(a for a in picked if x.shape[a] == 1)
    return mx.squeeze(x, drop) if drop else x


@register("Unsqueeze")
def unsqueeze(x, axis=0):
    """x with a new size-1 axis at ``axis`` (in [-ndim-1, ndim], as torch.unsqueeze)."""
    return mx.expand_dims(x, _axis(axis, x.ndim + 1, "Unsqueeze"))


@register("Split")
def split(x, axis=0, sizes=()):
    """x cut along ``axis`` into pieces of ``sizes`` (torch.split_with_sizes); a list.

    Raises:
        ValueError: sizes do not add up to the axis length.
    """
    ax = _axis(axis, x.ndim, "Split")
    if sum(sizes) != x.shape[ax]:
        raise ValueError(
            f"Split: sizes {list(sizes)} do not add up to axis {axis} of size {x.shape[ax]}"
        )
    cuts, at = [], 0
    for s in sizes[:-1]:
        at += s
        cuts.append(at)
    return mx.split(x, cuts, axis=ax) if cuts else [x]


@register("Cast")
def cast(x, dtype=None):
    """x converted to ``dtype`` (an mx.Dtype); floats to ints truncate toward zero.

    Raises:
        ValueError: dtype is absent.
    """
    if dtype is None:
        raise ValueError("Cast: dtype is required")
    return x if x.dtype == dtype else x.astype(dtype)
