"""Reduction kernels: mean, sum, max (amax), argmax and softmax, with torch semantics."""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register


def _axes(axes):
    """The axes to reduce: None (all) when absent or empty, as torch's dim=[] reduces all."""
    return list(axes) if axes else None


@register("Mean")
def mean(x, axes=None, keepdims=False):
    """Mean over ``axes`` (all when absent or empty)."""
    return mx.mean(x, axis=_axes(axes), keepdims=keepdims)


@register("Sum")
def sum_(x, axes=None, keepdims=False):
    """Sum over ``axes`` (all when absent or empty)."""
    return mx.sum(x, axis=_axes(axes), keepdims=keepdims)


@register("Max")
def max_(x, axes=None, keepdims=False):
    """Max value over ``axes`` (all when absent or empty), like torch.amax."""
    return mx.max(x, axis=_axes(axes), keepdims=keepdims)


@register("Argmax")
def argmax(x, axis=None, keepdims=False):
    """Index of the first max along ``axis`` as int64 (of the flattened x when axis is None)."""
    if axis is None:
        idx = mx.argmax(x.reshape(-1), axis=0)
        if keepdims:
            idx = idx.reshape((1,) * x.ndim)
    else:
        idx = mx.argmax(x, axis=axis, keepdims=keepdims)
    return idx.astype(mx.int64)


@register("Softmax")
def softmax(x, axis=-1):
    """Softmax along ``axis``, computed in float32 and returned in x's dtype."""
    # precise=True accumulates in float32 for half inputs and returns x's dtype.
    return mx.softmax(x, axis=axis, precise=True)
