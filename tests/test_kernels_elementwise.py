"""Elementwise kernels (unary math, binary arithmetic, comparisons, logic, where) against
torch eager, through the registry as the Program calls them (tests/kernel_helpers.py)."""

import math

import mlx.core as mx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import (
    BF16,
    BINARY,
    COMPARE,
    F16,
    FLOATS,
    TORCH_DTYPE,
    UNARY,
    call,
    check,
    rand,
    seeded,  # noqa: F401 - autouse: per-test seed for rand()
    to_mx,
)

POSITIVE = {"Log", "Sqrt", "Rsqrt", "Reciprocal"}
# ops defined on an interval of their own: log1p on (-1, inf), erfinv on (-1, 1)
DOMAIN = {"Log1p": (-0.9, 4.0), "Erfinv": (-0.99, 0.99)}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, dtype):
    t, x = rand((3, 17), dtype, *DOMAIN.get(op, (0.1, 4.0) if op in POSITIVE else (-4.0, 4.0)))
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
    check(
        call("Div", a=to_mx(ia), b=to_mx(ib), rounding=rounding),
        torch.div(ia, ib, rounding_mode=mode),
    )
    check(call("Div", a=to_mx(ia), b=-3, rounding=rounding), torch.div(ia, -3, rounding_mode=mode))
    for dtype in FLOATS:
        ta, a = rand((4, 8), dtype, -9, 9)
        tb, b = rand((8,), dtype, 0.5, 2)
        check(call("Div", a=a, b=-b, rounding=rounding), torch.div(ta, -tb, rounding_mode=mode),
              "elementwise", dtype)
    # Quotients just off an integer, where rounding them to half precision first would
    # move the floor (torch floors the float32 quotient): -16 / 0.55078125 = -29.05 -> -30.
    for dtype, pairs in (
        (BF16, [(-16.0, 0.55078125), (-15.75, 0.92578125), (-15.5, 1.546875)]),
        (F16, [(-16.0, 0.7998046875), (-15.75, 1.0498046875), (-15.5, 1.5498046875)]),
    ):
        ta = torch.tensor([p[0] for p in pairs], dtype=TORCH_DTYPE[dtype])
        tb = torch.tensor([p[1] for p in pairs], dtype=TORCH_DTYPE[dtype])
        check(
            call("Div", a=to_mx(ta), b=to_mx(tb), rounding=rounding),
            torch.div(ta, tb, rounding_mode=mode),
            "exact" if mode else "elementwise",
            dtype,
        )


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
