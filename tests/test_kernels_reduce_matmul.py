"""Reduction and matrix-product kernels against torch eager (tests/kernel_helpers.py)."""

import math

import mlx.core as mx
import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import (
    BF16,
    F16,
    FLOATS,
    TORCH_DTYPE,
    call,
    check,
    rand,
    seeded,  # noqa: F401 - autouse: per-test seed for rand()
    to_mx,
)

# ---------------------------------------------------------------- reductions

AXES = [None, [], [-1], [0, 2], [1, -1], [0, 1, 2]]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op,fn", [("Mean", torch.mean), ("Sum", torch.sum), ("Max", torch.amax)])
def test_reductions(op, fn, dtype):
    t, x = rand((3, 4, 37), dtype)
    for axes in AXES:
        for keepdims in (False, True):
            dim = axes if axes else ([] if op == "Max" else None)
            want = fn(t, dim=dim, keepdim=keepdims) if dim is not None else fn(t)
            if dim is None and keepdims:
                want = want.reshape((1, 1, 1))
            check(call(op, x=x, axes=axes, keepdims=keepdims), want, "reduce", dtype)


def test_sum_of_integers_and_bools():
    t, x = rand((4, 9), mx.int32, -5, 5)
    check(call("Sum", x=x, axes=[1]), torch.sum(t, 1))
    check(call("Sum", x=x > 0), torch.sum(t > 0))


def test_argmax():
    t = torch.tensor([[1, 5, 5, 0], [7, 7, 2, 7], [0, 0, 0, 0]])
    x = to_mx(t)
    for axis in (0, 1, -1):
        for keepdims in (False, True):
            got = call("Argmax", x=x, axis=axis, keepdims=keepdims)
            check(got, torch.argmax(t, dim=axis, keepdim=keepdims))
            assert got.dtype == mx.int64
    check(call("Argmax", x=x, axis=None), torch.argmax(t))
    check(call("Argmax", x=x, axis=None, keepdims=True), torch.argmax(t, keepdim=True))
    tf, xf = rand((3, 50), BF16)
    check(call("Argmax", x=xf, axis=-1), torch.argmax(tf, -1))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_softmax(dtype):
    t, x = rand((2, 3, 65), dtype, -20, 20)
    for axis in (-1, 1, 0):
        want = torch.softmax(t.float(), dim=axis).to(t.dtype)  # float32 then cast back
        check(call("Softmax", x=x, axis=axis), want, "elementwise", dtype)
    big = mx.array([[1e4, 0.0, -1e4, -math.inf]], dtype=dtype)
    check(call("Softmax", x=big, axis=-1), torch.tensor([[1.0, 0, 0, 0]], dtype=TORCH_DTYPE[dtype]))


# ---------------------------------------------------------------- matrix products


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_matmul(dtype):
    for sa, sb in [((5, 64), (64, 3)), ((2, 1, 5, 64), (3, 64, 4)), ((64,), (2, 64, 3)),
                   ((2, 5, 64), (64,)), ((64,), (64,))]:
        ta, a = rand(sa, dtype)
        tb, b = rand(sb, dtype)
        check(call("Matmul", a=a, b=b), torch.matmul(ta, tb), "matmul", dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_addmm(dtype):
    ta, a = rand((5, 48), dtype)
    tb, b = rand((48, 3), dtype)
    for bias_shape in ((3,), (5, 3), (1, 3)):
        tc, c = rand(bias_shape, dtype)
        for alpha, beta in ((1.0, 1.0), (0.5, 2.0), (2.0, 0.0)):
            check(call("Addmm", bias=c, a=a, b=b, alpha=alpha, beta=beta),
                  torch.addmm(tc, ta, tb, alpha=alpha, beta=beta), "matmul", dtype)
    nan_bias = mx.full((3,), math.nan, dtype=dtype)
    check(
        call("Addmm", bias=nan_bias, a=a, b=b, beta=0.0),
        torch.addmm(torch.full((3,), math.nan, dtype=ta.dtype), ta, tb, beta=0.0),
        "matmul",
        dtype,
    )


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_linear(dtype):
    tw, w = rand((6, 96), dtype, -0.5, 0.5)
    tb, b = rand((6,), dtype)
    for shape in ((96,), (3, 96), (2, 5, 96)):
        tx, x = rand(shape, dtype)
        check(call("Linear", x=x, weight=w, bias=b), F.linear(tx, tw, tb), "matmul", dtype)
        check(call("Linear", x=x, weight=w), F.linear(tx, tw), "matmul", dtype)


def test_embedding():
    tw, w = rand((11, 4), BF16)
    idx = torch.tensor([[0, 10, 3], [3, 3, 7]])
    for idt in (mx.int64, mx.int32):
        check(call("Embedding", weight=w, indices=to_mx(idx).astype(idt)), F.embedding(idx, tw))


def test_gather():
    t, x = rand((4, 5, 6), F16)
    for axis in (0, 1, 2, -1):
        ishape = [3, 4, 5]
        ishape[axis] = 7
        idx = torch.randint(
            0, t.shape[axis], ishape, generator=torch.Generator().manual_seed(axis + 3)
        )
        check(call("Gather", x=x, indices=to_mx(idx), axis=axis), torch.gather(t, axis, idx))
    with pytest.raises(ValueError, match="rank"):
        call("Gather", x=x, indices=mx.zeros((2, 2), dtype=mx.int64), axis=0)
