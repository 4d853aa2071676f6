"""Shared by the kernel tests: calling a kernel as the Program does, inputs, and the oracle check.

The kernels are checked against torch eager (the semantics the exporter lowers from).
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

import zlib

import mlx.core as mx
import numpy as np
import pytest
import torch

from mlxgraph.interpreter.kernels import get_kernel
from mlxgraph.schema.op_catalogue import Trait, ops_with
from mlxgraph.schema.spec import load_schema, op_spec

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


@pytest.fixture(autouse=True)
def seeded(request):
    """Seed ``rand`` from the test's name, so a test sees the same inputs however it is run."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))

# The torch oracle of each elementwise op family (also the ops the laziness check covers).
# A unary op lowered from one ATen op is checked against that op (schema/op_catalogue.py).
UNARY = {op.name: getattr(torch.ops.aten, op.aten).default
         for op in ops_with(Trait.UNARY) if op.aten is not None}
BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div,
          "Maximum": torch.maximum, "Minimum": torch.minimum, "Remainder": torch.remainder}
COMPARE = {"Equal": torch.eq, "NotEqual": torch.ne, "Less": torch.lt, "LessEqual": torch.le,
           "Greater": torch.gt, "GreaterEqual": torch.ge, "LogicalAnd": torch.logical_and,
           "LogicalOr": torch.logical_or}


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
    """Run op's registered kernel with its input and attribute fields by name (as the
    Program does: never the output fields)."""
    spec = op_spec(op)
    kwargs = {}
    for f in spec.inputs + spec.attributes:
        kwargs[f.name] = given[f.name] if f.name in given else _default(f)
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
    """A torch tensor as an mx array of the same dtype and values."""
    if t.dtype == torch.bfloat16:
        return mx.array(t.float().numpy()).astype(BF16)
    return mx.array(t.numpy())


def check(got, want, family="exact", dtype=None):
    """got (mx) equals want (torch) in shape, float dtype and value (within the family's
    tolerance)."""
    want = want if isinstance(want, torch.Tensor) else torch.tensor(want)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    if want.dtype.is_floating_point:
        assert got.dtype == MX_DTYPE[want.dtype], (got.dtype, want.dtype)
    rtol, atol = TOL[family][dtype or (got.dtype if got.dtype in FLOATS else F32)]
    g = np.array(got.astype(F32) if got.dtype == BF16 else got).astype(np.float64)
    w = want.double().numpy()
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
