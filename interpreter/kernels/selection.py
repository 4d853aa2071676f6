"""Selection kernels: TopK (the routers of mixture-of-experts decoders), with torch.topk's
semantics for ``sorted=True``."""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register


@register("TopK")
def top_k(x, k=None, axis=None, largest=True):
    """[values, indices]: the ``k`` largest (or smallest) entries of x along ``axis``, sorted
    descending (ascending when ``largest`` is false); indices are int64 like torch's.

    Raises:
        ValueError: k or axis is absent, or k is outside [0, size of the axis].
        IndexError: axis out of range.
    """
    if k is None:
        raise ValueError("TopK: k is required")
    if axis is None:
        raise ValueError("TopK: axis is required")
    if not -x.ndim <= axis < x.ndim:
        raise IndexError(f"TopK: axis {axis} out of range for a tensor of rank {x.ndim}")
    ax = axis % x.ndim
    size = x.shape[ax]
    if not 0 <= k <= size:
        raise ValueError(
            f"TopK: k={k} outside [0, {size}] for axis {axis} of shape {tuple(x.shape)}"
        )
    # Work on the last axis: an ascending argsort, then its head (smallest) or its tail
    # read backwards (largest). Reversing rather than sorting -x keeps unsigned and
    # boolean inputs correct.
    last = mx.moveaxis(x, ax, -1)
    order = mx.argsort(last, axis=-1)
    idx = order[..., size - k:][..., ::-1] if largest else order[..., :k]
    values = mx.take_along_axis(last, idx, axis=-1)
    return [mx.moveaxis(values, -1, ax), mx.moveaxis(idx.astype(mx.int64), -1, ax)]
