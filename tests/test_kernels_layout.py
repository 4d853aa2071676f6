"""Layout, creation and runtime-int kernels against torch eager (tests/kernel_helpers.py)."""

import math

import mlx.core as mx
import pytest
import torch
from kernel_helpers import (
    BF16,
    F16,
    F32,
    TORCH_DTYPE,
    call,
    check,
    rand,
    seeded,  # noqa: F401 - autouse: per-test seed for rand()
)

# ---------------------------------------------------------------- layout


def test_reshape_permute_expand():
    t, x = rand((2, 3, 4), F16)
    check(call("Reshape", x=x, shape=[4, -1]), t.reshape(4, -1))
    check(call("Reshape", x=x, shape=[2, 3, 2, 2]), t.reshape(2, 3, 2, 2))
    check(call("Permute", x=x, perm=[2, 0, 1]), t.permute(2, 0, 1))
    check(call("Permute", x=x, perm=[-1, -3, 1]), t.permute(-1, -3, 1))
    t1, x1 = rand((3, 1), F16)
    check(call("Expand", x=x1, shape=[2, 3, 5]), t1.expand(2, 3, 5))
    check(call("Expand", x=x1, shape=[4, -1, 6]), t1.expand(4, -1, 6))
    check(call("Expand", x=x1, shape=[-1, -1]), t1.expand(-1, -1))
    with pytest.raises(TypeError, match="Reshape: shape\\[0\\].*tensor"):
        call("Reshape", x=x, shape=[mx.array(4), -1])
    with pytest.raises(ValueError, match="new leading axis"):
        call("Expand", x=x1, shape=[-1, 3, 1])
    # Permute hands perm to MLX as is: its errors are still the kernel's.
    with pytest.raises(IndexError, match="Permute: axis 3 out of range for a tensor of rank 3"):
        call("Permute", x=x, perm=[0, 3, 1])
    with pytest.raises(IndexError, match="Permute: axis -4 out of range"):
        call("Permute", x=x, perm=[-4, 0, 1])
    with pytest.raises(ValueError):
        call("Permute", x=x, perm=[0, 0, 1])
    with pytest.raises(ValueError):
        call("Permute", x=x, perm=[0, 1])


SLICES = [(0, 5, 1), (1, 2**63 - 1, 1), (-3, 2**63 - 1, 1), (-100, 3, 1), (2, -1, 2), (5, 2, 1),
          (0, 9, 3), (None, None, 1), (None, -2, 2), (3, None, 1), (7, 100, 1), (-2, -1, 1)]


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_slice(axis):
    t, x = rand((7, 6, 5), F32)
    for start, end, step in SLICES:
        idx = [slice(None)] * 3
        idx[axis] = slice(start, end, step)
        check(call("Slice", x=x, axis=axis, start=start, end=end, step=step), t[tuple(idx)])
    with pytest.raises(ValueError, match="step"):
        call("Slice", x=x, axis=0, start=0, end=3, step=0)
    with pytest.raises(TypeError, match="Slice: start"):
        call("Slice", x=x, axis=0, start=mx.array(1), end=3)


def test_select():
    t, x = rand((4, 3, 5), BF16)
    for axis in (0, 1, -1):
        for index in (0, 2, -1):
            check(call("Select", x=x, axis=axis, index=index), t.select(axis, index))
        check(call("Select", x=x, axis=axis, index=mx.array(1)), t.select(axis, 1))
    with pytest.raises(IndexError, match="Select: index 5"):
        call("Select", x=x, axis=1, index=5)


def test_concat_squeeze_unsqueeze_split_cast():
    ta, a = rand((2, 3), F16)
    tb, b = rand((2, 5), F16)
    check(call("Concat", inputs=[a, b, a], axis=1), torch.cat([ta, tb, ta], 1))
    check(call("Concat", inputs=[a, a], axis=-2), torch.cat([ta, ta], -2))
    t, x = rand((1, 3, 1, 2), F32)
    for axes in (None, [], [0], [1], [0, 2], [-2, -1], [1, 3]):
        want = t.squeeze() if not axes else t.squeeze(tuple(axes))
        check(call("Squeeze", x=x, axes=axes), want)
    for axis in (0, 2, 4, -1, -5):
        check(call("Unsqueeze", x=x, axis=axis), t.unsqueeze(axis))
    t, x = rand((3, 10), F32)
    for axis, sizes in ((1, [3, 3, 4]), (-1, [10]), (0, [1, 2]), (1, [0, 10])):
        got = call("Split", x=x, axis=axis, sizes=sizes)
        want = torch.split(t, sizes, dim=axis)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            check(g, w)
    with pytest.raises(ValueError, match="add up"):
        call("Split", x=x, axis=1, sizes=[3, 3])
    t, x = rand((4, 6), F32, -5, 5)
    for dt in (mx.int32, mx.int64, mx.bool_, F16, BF16):
        check(call("Cast", x=x, dtype=dt), t.to(TORCH_DTYPE[dt]))


# ---------------------------------------------------------------- creation and runtime ints


def test_arange():
    for args in ((0, 5, 1), (2, 11, 3), (-4, 4, 2), (0.0, 1.0, 0.3), (0, 1, 0.25), (5, 0, -1)):
        check(call("Arange", start=args[0], end=args[1], step=args[2]), torch.arange(*args))
    check(call("Arange", end=6), torch.arange(6))
    for dt in (mx.int32, F16, BF16):
        check(call("Arange", start=1, end=9, step=2, dtype=dt),
              torch.arange(1, 9, 2, dtype=TORCH_DTYPE[dt]))


def test_full():
    check(call("Full", shape=[2, 3], value=1.5), torch.full((2, 3), 1.5))
    check(call("Full", shape=[2, 3], value=7), torch.full((2, 3), 7))
    check(call("Full", shape=[4], value=True), torch.full((4,), True))
    check(
        call("Full", shape=[], value=-math.inf, dtype=BF16),
        torch.full((), -math.inf, dtype=torch.bfloat16),
    )
    check(
        call("Full", shape=[3, 1], value=3.0, dtype=mx.int64),
        torch.full((3, 1), 3, dtype=torch.int64),
    )
    with pytest.raises(TypeError, match="Full: shape\\[1\\]"):
        call("Full", shape=[2, mx.array(3)], value=0.0)


def test_sym_size_and_arith():
    x = mx.zeros((2, 7, 5))
    assert [call("SymSize", x=x, axis=a) for a in (0, 1, -1)] == [2, 7, 5]
    assert type(call("SymSize", x=x, axis=1)) is int
    from mlxgraph.schema.enums import SymOp
    for a, b in ((7, 3), (-7, 3), (7, -3), (-7, -3), (0, 5)):
        # floordiv and mod against torch's integer semantics (round toward -inf, the sign
        # of the divisor), the rest against Python's.
        ta = torch.tensor(a)
        want = {
            SymOp.add: a + b,
            SymOp.sub: a - b,
            SymOp.mul: a * b,
            SymOp.floordiv: int(torch.div(ta, b, rounding_mode="floor")),
            SymOp.mod: int(torch.remainder(ta, b)),
            SymOp.min: min(a, b),
            SymOp.max: max(a, b),
            SymOp.neg: -a,
        }
        for code, w in want.items():
            assert call("SymArith", op=code, a=a, b=b) == w, (code, a, b)
    assert call("SymArith", op="floordiv", a=-9, b=4) == -3
    with pytest.raises(TypeError, match="SymArith: a .*tensor"):
        call("SymArith", op=SymOp.add, a=mx.array(1), b=2)
