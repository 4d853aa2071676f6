"""The MLX kernels against torch eager (the semantics the exporter lowers from).

Every kernel is called through the registry with every field of its op table by name, as
the Program calls it (fields left out take their schema defaults). Inputs are random,
rounded to the tested dtype in torch first so both sides see identical values.

Tolerances (rtol, atol), written down per op family and dtype:

| family      | float32        | float16        | bfloat16       |
|-------------|----------------|----------------|----------------|
| exact       | 0, 0           | 0, 0           | 0, 0           |
| elementwise | 1e-5, 1e-6     | 2e-3, 1e-3     | 1.6e-2, 1e-2   |
| reduce      | 1e-5, 1e-5     | 5e-3, 5e-3     | 3e-2, 3e-2     |
| matmul      | 1e-4, 1e-4     | 1e-2, 1e-2     | 5e-2, 5e-2     |

exact: layout, comparisons, logic, integer math, creation. Half-precision elementwise
tolerances allow a couple of ulps: torch computes half math in float32 and rounds once,
MLX may round intermediate results (e.g. Gelu). Measured with these inputs, the largest
error is 0.41 of its tolerance (Gelu, float16); RmsNorm, Rope and Softmax in half
precision came out bit-identical to torch.
"""

import inspect
import math
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mlxgraph.interpreter.kernels import get_kernel
from mlxgraph.schema.spec import load_schema, op_specs

F32, F16, BF16 = mx.float32, mx.float16, mx.bfloat16
FLOATS = [F32, F16, BF16]
TORCH_DTYPE = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16,
               mx.int32: torch.int32, mx.int64: torch.int64, mx.bool_: torch.bool}
MX_DTYPE = {v: k for k, v in TORCH_DTYPE.items()}
TOL = {
    "exact": {F32: (0, 0), F16: (0, 0), BF16: (0, 0)},
    "elementwise": {F32: (1e-5, 1e-6), F16: (2e-3, 1e-3), BF16: (1.6e-2, 1e-2)},
    "reduce": {F32: (1e-5, 1e-5), F16: (5e-3, 5e-3), BF16: (3e-2, 3e-2)},
    "matmul": {F32: (1e-4, 1e-4), F16: (1e-2, 1e-2), BF16: (5e-2, 5e-2)},
}
RNG = np.random.default_rng(0)


# ---------------------------------------------------------------- helpers


def _default(field):
    """The value the Program passes for a field left out of the node: its schema default."""
    d = field.default
    if d is None or d == "null" or field.is_vector:
        return None
    if d in ("true", "false"):
        return d == "true"
    enum = load_schema().types.get(field.type)
    if enum is not None and enum.kind == "enum":
        return enum.values[d]
    return float(d) if field.type in ("float", "double") else int(d)


def call(op, /, **given):
    """Run op's registered kernel with every field of its table by name."""
    spec = op_specs()[next(c for c, s in op_specs().items() if s.short_name == op)]
    kwargs = {}
    for f in spec.table.fields:
        if "deprecated" in f.attributes:
            continue
        if f.name in given:
            kwargs[f.name] = given[f.name]
        elif f.role in ("out", "value_out"):
            kwargs[f.name] = [0, 1] if f.is_vector else 0
        else:
            kwargs[f.name] = _default(f)
    unknown = set(given) - set(kwargs)
    assert not unknown, f"{op} has no fields {unknown}"
    return get_kernel(spec.name).fn(**kwargs)


def rand(shape, dtype=F32, low=-3.0, high=3.0):
    """(torch tensor, mx array) holding the same random values in ``dtype``."""
    if dtype in (mx.int32, mx.int64):
        a = RNG.integers(int(low), int(high), size=shape)
        return torch.tensor(a, dtype=TORCH_DTYPE[dtype]), mx.array(a).astype(dtype)
    t = torch.tensor(RNG.uniform(low, high, size=shape), dtype=torch.float32).to(TORCH_DTYPE[dtype])
    return t, to_mx(t)


def to_mx(t):
    if t.dtype == torch.bfloat16:
        return mx.array(t.float().numpy()).astype(BF16)
    return mx.array(t.numpy())


def check(got, want, family="exact", dtype=None):
    """got (mx) equals want (torch) in shape, float dtype and value within the family's tolerance."""
    want = want if isinstance(want, torch.Tensor) else torch.tensor(want)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    if want.dtype.is_floating_point:
        assert got.dtype == MX_DTYPE[want.dtype], (got.dtype, want.dtype)
    rtol, atol = TOL[family][dtype or (got.dtype if got.dtype in FLOATS else F32)]
    g = np.array(got.astype(F32) if got.dtype == BF16 else got).astype(np.float64)
    w = want.double().numpy()
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)


# ---------------------------------------------------------------- the registry


def test_every_op_has_a_kernel_taking_its_fields():
    missing, bad = [], []
    for spec in op_specs().values():
        if spec.name == "UpdateAndAttendNode":
            continue
        kernel = get_kernel(spec.name)
        if kernel is None:
            missing.append(spec.name)
            continue
        fields = {f.name: None for f in spec.table.fields if "deprecated" not in f.attributes}
        try:
            inspect.signature(kernel.fn).bind(**fields)
        except TypeError as e:
            bad.append(f"{spec.name}: {e}")
    assert not missing, f"ops without a kernel: {missing}"
    assert not bad, f"kernels that do not take their op's fields: {bad}"
    assert set(EXAMPLES) >= {s.short_name for s in op_specs().values()} - {"UpdateAndAttend"}


def test_kernel_sources_never_force_evaluation():
    src = Path(get_kernel("AddNode").fn.__code__.co_filename).parent
    for path in sorted(src.glob("*.py")):
        if path.name == "attention.py":
            continue
        text = path.read_text()
        for pat in (r"\.item\(", r"\.tolist\(", r"mx\.(async_)?eval\(", r"^\s*(import|from) numpy"):
            assert not re.search(pat, text, re.M), f"{path.name} matches {pat}"


# ---------------------------------------------------------------- elementwise

UNARY = {
    "Neg": torch.neg, "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt,
    "Rsqrt": torch.rsqrt, "Sin": torch.sin, "Cos": torch.cos, "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid, "Silu": F.silu, "Abs": torch.abs, "Reciprocal": torch.reciprocal,
    "Erf": torch.erf,
}
POSITIVE = {"Log", "Sqrt", "Rsqrt", "Reciprocal"}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, dtype):
    t, x = rand((3, 17), dtype, *((0.1, 4.0) if op in POSITIVE else (-4.0, 4.0)))
    check(call(op, x=x), UNARY[op](t), "elementwise", dtype)


@pytest.mark.parametrize("op", ["Exp", "Sqrt", "Sigmoid", "Silu", "Neg", "Abs", "Reciprocal"])
def test_unary_on_integers(op):
    t, x = rand((2, 5), mx.int32, 1, 9)
    want = UNARY[op](t.float()) if op == "Silu" else UNARY[op](t)  # F.silu rejects ints
    check(call(op, x=x), want, "elementwise")


def test_logical_not():
    t, x = rand((4, 4), mx.int32, -1, 2)
    check(call("LogicalNot", x=x), torch.logical_not(t))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("approximate", [False, True])
def test_gelu(approximate, dtype):
    t, x = rand((4, 33), dtype, -5, 5)
    want = F.gelu(t, approximate="tanh" if approximate else "none")
    check(call("Gelu", x=x, approximate=approximate), want, "elementwise", dtype)


@pytest.mark.parametrize("lo,hi", [(-1.0, 1.5), (None, 0.5), (-0.5, None)])
def test_clamp(lo, hi):
    t, x = rand((5, 6), F16)
    assert call("Clamp", x=x) is x  # no bounds: torch refuses, the kernel passes x through
    check(call("Clamp", x=x, min=lo, max=hi), torch.clamp(t, lo, hi))
    ti, xi = rand((5, 6), mx.int32, -9, 9)
    got = call("Clamp", x=xi, min=lo and math.floor(lo), max=hi and math.ceil(hi))
    assert got.dtype == mx.int32
    check(got, torch.clamp(ti, lo and math.floor(lo), hi and math.ceil(hi)))


BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div,
          "Maximum": torch.maximum, "Minimum": torch.minimum, "Remainder": torch.remainder}
SHAPES = [((3, 4), (3, 4)), ((2, 1, 4), (3, 1)), ((4,), (2, 3, 4)), ((1,), (5, 1))]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcasting(op, dtype):
    for sa, sb in SHAPES:
        ta, a = rand(sa, dtype)
        tb, b = rand(sb, dtype, 0.5, 3.0)  # negative divisors: test_remainder_sign_of_divisor
        check(call(op, a=a, b=b), BINARY[op](ta, tb), "elementwise", dtype)


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_weak_scalars(op):
    """A Python literal keeps the tensor's dtype (float16 * 2.0 stays float16), either side."""
    ta, a = rand((3, 5), F16, 0.5, 3.0)
    for s in (2.5, -3, 2):
        ts = torch.tensor(s) if op in ("Maximum", "Minimum") else s  # 0-d: weak in torch too
        check(call(op, a=a, b=s), BINARY[op](ta, ts), "elementwise", F16)
        check(call(op, a=s, b=a), BINARY[op](ts, ta), "elementwise", F16)


def test_binary_nan_propagates():
    a = mx.array([1.0, float("nan"), 2.0])
    b = mx.array([float("nan"), 0.0, 1.0])
    for op in ("Maximum", "Minimum"):
        check(call(op, a=a, b=b), BINARY[op](torch.tensor(np.array(a)), torch.tensor(np.array(b))))


@pytest.mark.parametrize("rounding", [0, 1, 2, "trunc", "floor"])
def test_div_rounding(rounding):
    mode = {0: None, 1: "trunc", 2: "floor"}.get(rounding, rounding)
    ia, ib = torch.tensor([-7, 7, -7, 7, -6, 6, 0, 5]), torch.tensor([2, 2, -2, -2, 3, -3, 4, 5])
    check(call("Div", a=to_mx(ia), b=to_mx(ib), rounding=rounding), torch.div(ia, ib, rounding_mode=mode))
    check(call("Div", a=to_mx(ia), b=-3, rounding=rounding), torch.div(ia, -3, rounding_mode=mode))
    for dtype in FLOATS:
        ta, a = rand((4, 8), dtype, -9, 9)
        tb, b = rand((8,), dtype, 0.5, 2)
        check(call("Div", a=a, b=-b, rounding=rounding), torch.div(ta, -tb, rounding_mode=mode),
              "elementwise", dtype)


def test_remainder_sign_of_divisor():
    ia, ib = torch.tensor([-7, 7, -7, 7, 0]), torch.tensor([3, 3, -3, -3, 3])
    check(call("Remainder", a=to_mx(ia), b=to_mx(ib)), torch.remainder(ia, ib))
    fa, fb = ia.float() + 0.5, ib.float()
    check(call("Remainder", a=to_mx(fa), b=to_mx(fb)), torch.remainder(fa, fb), "elementwise")
    check(call("Remainder", a=to_mx(fa), b=-2), torch.remainder(fa, -2), "elementwise")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_pow(dtype):
    t, x = rand((3, 7), dtype, -2, 2)
    for e in (2.0, 2, 3, 0.5, -1.0):
        check(call("Pow", a=x, b=e), torch.pow(t, e), "elementwise", dtype)
    tp, p = rand((3, 7), dtype, 0.5, 2)
    check(call("Pow", a=p, b=x), torch.pow(tp, t), "elementwise", dtype)
    check(call("Pow", a=2.0, b=x), torch.pow(2.0, t), "elementwise", dtype)
    ti, xi = rand((4,), mx.int32, 0, 5)
    check(call("Pow", a=xi, b=2), torch.pow(ti, 2))


COMPARE = {"Equal": torch.eq, "NotEqual": torch.ne, "Less": torch.lt, "LessEqual": torch.le,
           "Greater": torch.gt, "GreaterEqual": torch.ge, "LogicalAnd": torch.logical_and,
           "LogicalOr": torch.logical_or}


@pytest.mark.parametrize("op", sorted(COMPARE))
def test_comparisons_and_logic(op):
    ta, a = rand((2, 1, 6), mx.int32, -2, 3)
    tb, b = rand((3, 1), mx.int32, -2, 3)
    check(call(op, a=a, b=b), COMPARE[op](ta, tb))
    check(call(op, a=a, b=1), COMPARE[op](ta, torch.tensor(1)))
    tf, f = rand((3, 6), F16)
    check(call(op, a=f, b=0.5), COMPARE[op](tf, torch.tensor(0.5)))


def test_where():
    tc, c = rand((3, 1), mx.int32, 0, 2)
    ta, a = rand((1, 4), F16)
    tb, b = rand((3, 4), F16)
    check(call("Where", cond=c, a=a, b=b), torch.where(tc.bool(), ta, tb))
    check(call("Where", cond=c, a=a, b=0.0), torch.where(tc.bool(), ta, 0.0))
    check(call("Where", cond=c, a=-math.inf, b=a), torch.where(tc.bool(), -math.inf, ta))
    check(call("Where", cond=c.astype(mx.bool_), a=1.0, b=0.0), torch.where(tc.bool(), 1.0, 0.0))


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
    check(call("Addmm", bias=nan_bias, a=a, b=b, beta=0.0),
          torch.addmm(torch.full((3,), math.nan, dtype=ta.dtype), ta, tb, beta=0.0), "matmul", dtype)


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
        idx = torch.randint(0, t.shape[axis], ishape, generator=torch.Generator().manual_seed(axis + 3))
        check(call("Gather", x=x, indices=to_mx(idx), axis=axis), torch.gather(t, axis, idx))
    with pytest.raises(ValueError, match="rank"):
        call("Gather", x=x, indices=mx.zeros((2, 2), dtype=mx.int64), axis=0)


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
        got = call("Split", x=x, axis=axis, sizes=sizes, outs=list(range(len(sizes))))
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
    check(call("Full", shape=[], value=-math.inf, dtype=BF16), torch.full((), -math.inf, dtype=torch.bfloat16))
    check(call("Full", shape=[3, 1], value=3.0, dtype=mx.int64), torch.full((3, 1), 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="Full: shape\\[1\\]"):
        call("Full", shape=[2, mx.array(3)], value=0.0)


def test_sym_size_and_arith():
    x = mx.zeros((2, 7, 5))
    assert [call("SymSize", x=x, axis=a) for a in (0, 1, -1)] == [2, 7, 5]
    assert type(call("SymSize", x=x, axis=1)) is int
    from mlxgraph.generated.mlxgraph_generated import SymOp
    for a, b in ((7, 3), (-7, 3), (7, -3), (-7, -3), (0, 5)):
        want = {SymOp.add: a + b, SymOp.sub: a - b, SymOp.mul: a * b, SymOp.floordiv: a // b,
                SymOp.mod: a % b, SymOp.min: min(a, b), SymOp.max: max(a, b), SymOp.neg: -a}
        for code, w in want.items():
            assert call("SymArith", op=code, a=a, b=b) == w
        assert torch.sym_int(a) // b == a // b  # torch sym ints round toward -inf too
    assert call("SymArith", op="floordiv", a=-9, b=4) == -3
    with pytest.raises(TypeError, match="SymArith: a .*tensor"):
        call("SymArith", op=SymOp.add, a=mx.array(1), b=2)


# ---------------------------------------------------------------- fusions


@pytest.fixture(scope="module")
def hf():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb
    return LlamaRMSNorm, Gemma3RMSNorm, apply_rotary_pos_emb


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_rms_norm_matches_hugging_face(hf, dtype):
    llama_cls, gemma_cls, _ = hf
    tx, x = rand((2, 5, 64), dtype, -4, 4)
    tw, w = rand((64,), dtype, -1, 1)
    llama = llama_cls(64, eps=1e-5).to(TORCH_DTYPE[dtype])
    gemma = gemma_cls(64, eps=1e-6).to(TORCH_DTYPE[dtype])
    with torch.no_grad():
        llama.weight.copy_(tw)
        gemma.weight.copy_(tw)
        want_llama, want_gemma = llama(tx), gemma(tx)
    # Both orders are checked to within one rounding of x's dtype (MLX and torch may
    # round the float32 rsqrt differently by an ulp).
    check(call("RmsNorm", x=x, weight=w, eps=1e-5), want_llama, "elementwise", dtype)
    check(call("RmsNorm", x=x, weight=w, eps=1e-6, weight_offset=1.0), want_gemma, "elementwise", dtype)
    check(call("RmsNorm", x=x, weight=w.astype(F32), eps=1e-5),
          tw.float() * (tx.float() * torch.rsqrt(tx.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(tx.dtype),
          "elementwise", dtype)
    with torch.no_grad():
        llama.weight.fill_(1.0)
        check(call("RmsNorm", x=x, eps=1e-5), llama(tx), "elementwise", dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_rope_matches_hugging_face(hf, dtype):
    _, _, apply_rotary_pos_emb = hf
    tq, q = rand((1, 4, 6, 32), dtype)
    tk, k = rand((1, 2, 6, 32), dtype)
    ang = torch.arange(6)[:, None] * (10000.0 ** (-torch.arange(16) / 16))[None]
    emb = torch.cat([ang, ang], -1)[None]  # [1, T, D] as HF's rotary embedding returns it
    cos, sin = emb.cos().to(TORCH_DTYPE[dtype]), emb.sin().to(TORCH_DTYPE[dtype])
    want_q, want_k = apply_rotary_pos_emb(tq, tk, cos, sin)
    mcos, msin = to_mx(cos)[:, None], to_mx(sin)[:, None]
    check(call("Rope", x=q, cos=mcos, sin=msin), want_q, "elementwise", dtype)
    check(call("Rope", x=k, cos=mcos, sin=msin), want_k, "elementwise", dtype)


# ---------------------------------------------------------------- laziness

_X = mx.ones((2, 3, 4))
_I = mx.array([[0, 2, 1]])
EXAMPLES = {op: dict(x=_X) for op in list(UNARY) + ["LogicalNot", "Gelu", "Clamp"]}
EXAMPLES.update({op: dict(a=_X, b=2.0) for op in list(BINARY) + list(COMPARE) + ["Pow"]})
EXAMPLES.update({op: dict(x=_X, axes=[1]) for op in ("Mean", "Sum", "Max")})
EXAMPLES.update(
    Clamp=dict(x=_X, min=0.0, max=1.0), Where=dict(cond=_X > 0, a=_X, b=0.0),
    Argmax=dict(x=_X, axis=-1), Softmax=dict(x=_X, axis=-1),
    Matmul=dict(a=_X, b=_X.swapaxes(-1, -2)), Addmm=dict(bias=_X[0, :, 0], a=_X[0], b=_X[0].T),
    Linear=dict(x=_X, weight=_X[0], bias=_X[0, :, 0]), Embedding=dict(weight=_X[0], indices=_I),
    Gather=dict(x=_X[0], indices=_I, axis=1), Reshape=dict(x=_X, shape=[6, -1]),
    Permute=dict(x=_X, perm=[2, 0, 1]), Expand=dict(x=_X, shape=[5, -1, -1, -1]),
    Slice=dict(x=_X, axis=-1, start=1, end=2**63 - 1), Select=dict(x=_X, axis=1, index=mx.array(2)),
    Concat=dict(inputs=[_X, _X], axis=0), Squeeze=dict(x=_X[:1]), Unsqueeze=dict(x=_X, axis=0),
    Split=dict(x=_X, axis=2, sizes=[1, 3]), Cast=dict(x=_X, dtype=F16),
    Arange=dict(start=0, end=5, step=1), Full=dict(shape=[2, 2], value=1.0),
    SymSize=dict(x=_X, axis=0), SymArith=dict(op=0, a=1, b=2),
    RmsNorm=dict(x=_X, weight=_X[0, 0], eps=1e-6), Rope=dict(x=_X, cos=_X[0, 0], sin=_X[0, 0]),
)


def test_no_kernel_forces_evaluation():
    """Each kernel traced under mx.compile: any evaluation inside would raise."""
    for op, kwargs in EXAMPLES.items():
        arrays = {k: v for k, v in kwargs.items() if isinstance(v, mx.array)}
        rest = {k: v for k, v in kwargs.items() if k not in arrays}
        names = sorted(arrays)

        def run(*vals, op=op, names=names, rest=rest):
            result = call(op, **dict(zip(names, vals, strict=True)), **rest)
            return result if isinstance(result, (mx.array, list)) else mx.array(result)

        mx.eval(mx.compile(run)(*[arrays[n] for n in names]))
