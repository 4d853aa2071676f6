"""TopK against torch.topk (sorted): values and int64 indices, both directions, any axis.

Inputs are permutations of distinct small integers (exact in every float dtype), so
there are no ties and the indices are fully determined.
"""

import mlx.core as mx
import numpy as np
import pytest
import torch
from kernel_helpers import BF16, F16, F32, call, check, to_mx

SHAPE = (3, 5, 7)


def _distinct(dtype, seed=0):
    """(torch, mx) of SHAPE holding a permutation of 0..N-1 shifted to straddle zero."""
    values = np.random.default_rng(seed).permutation(int(np.prod(SHAPE))) - 50
    t = torch.tensor(values.reshape(SHAPE), dtype=torch.float32)
    if dtype == mx.int32:
        t = t.to(torch.int32)
    else:
        t = t.to({F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[dtype])
    return t, to_mx(t)


@pytest.mark.parametrize("dtype", [F32, F16, BF16, mx.int32])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(dtype, axis, largest):
    t, x = _distinct(dtype)
    for k in (1, 2, SHAPE[axis]):
        values, indices = call("TopK", x=x, k=k, axis=axis, largest=largest)
        want = torch.topk(t, k, dim=axis, largest=largest, sorted=True)
        check(values, want.values)
        assert indices.dtype == mx.int64
        check(indices, want.indices)


def test_topk_of_zero_entries():
    t, x = _distinct(F32)
    values, indices = call("TopK", x=x, k=0, axis=1)
    assert values.shape == (3, 0, 7) and indices.shape == (3, 0, 7)


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(k=None, axis=1), ValueError, "k is required"),
    (dict(k=1), ValueError, "axis is required"),
    (dict(k=6, axis=1), ValueError, "k=6 outside"),
    (dict(k=-1, axis=1), ValueError, "outside"),
    (dict(k=1, axis=3), IndexError, "axis 3 out of range"),
])
def test_topk_rejects_bad_fields(kwargs, error, text):
    _, x = _distinct(F32)
    with pytest.raises(error, match=text):
        call("TopK", x=x, **kwargs)
