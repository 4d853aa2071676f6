"""Matrix-product and lookup kernels: matmul, addmm, linear, embedding, gather."""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register
from mlxgraph.interpreter.native.quantized import half_eligible, native_kernel


@register("Matmul")
def matmul(a, b):
    """a @ b with torch.matmul's batching and 1-D rules."""
    return mx.matmul(a, b)


@register("Addmm")
def addmm(bias, a, b, alpha=1.0, beta=1.0):
    """beta * bias + alpha * (a @ b); bias broadcasts. beta == 0 ignores bias (even NaN)."""
    if beta == 0:
        prod = mx.matmul(a, b)
        return prod if alpha == 1 else alpha * prod
    return mx.addmm(bias, a, b, alpha=alpha, beta=beta)


@register("Linear")
def linear(x, weight, bias=None):
    """x @ weight.T (+ bias); weight is [out_features, in_features] as torch stores it."""
    # float32 (the common CPU case) skips the half-kernel checks below at once.
    native = None if x.dtype == mx.float32 else native_kernel()
    if native is not None and mx.default_device() == mx.cpu and half_eligible(native, x, weight):
        # MLX's CPU product in half precision is a plain loop (~25-50x float32's BLAS here):
        # decode-sized steps take the native kernel (float32 sums, rounded once at the end).
        y = native.half_fn(x, weight)
        return (y if bias is None else y + bias).astype(x.dtype)
    # weight.T is a strided view: the matmul reads it transposed, nothing is copied.
    wt = weight.T
    if bias is None:
        return mx.matmul(x, wt)
    if x.ndim < 2:
        return mx.matmul(x, wt) + bias
    return mx.addmm(bias, x, wt)


@register("Embedding")
def embedding(weight, indices):
    """Rows of ``weight`` at ``indices``: out shape indices.shape + weight.shape[1:]."""
    return mx.take(weight, indices, axis=0)


@register("Gather")
def gather(x, indices, axis=0):
    """torch.gather: out[i][j] = x[i][indices[i][j]] along ``axis`` (take along axis).

    As in torch, ``indices`` may be smaller than x on the other axes; x is cut to match.

    Raises:
        ValueError: indices and x differ in rank.
    """
    if indices.ndim != x.ndim:
        raise ValueError(f"Gather: indices have rank {indices.ndim}, x has rank {x.ndim}")
    ax = axis % x.ndim
    cut = tuple(
        slice(None) if d == ax or indices.shape[d] == x.shape[d] else slice(0, indices.shape[d])
        for d in range(x.ndim)
    )
    if any(s != slice(None) for s in cut):
        x = x[cut]
    return mx.take_along_axis(x, indices, axis=ax)
