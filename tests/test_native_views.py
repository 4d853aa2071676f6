"""The native primitives (interpreter/native/activations.cpp, attention_softmax.cpp,
norm_rope.cpp) take views as they are: a transposed, strided or broadcast input is gathered
inside the primitive's evaluation, with no Contiguous or Broadcast node built around it
(each graph node costs ~1.2 us of host time per decode step), and the result is bitwise
the one of the same values given row-contiguous (and, for RoPE, bitwise MLX's own ops)."""

import io
import re

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.interpreter.native import activations as na

NATIVE = na.native_module()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="native kernels not built")


def _nodes(*outputs) -> list:
    """The labels of the graph nodes (not the evaluated leaves) that compute ``outputs``."""
    dot = io.StringIO()
    mx.export_to_dot(dot, *outputs)
    return re.findall(r'label ="([^"]+)"', dot.getvalue())


def _views(shape, seed):
    """(name, view, its row-contiguous copy) for views of ``shape``: transposed, strided,
    broadcast, and the row-contiguous array itself; each view evaluated, its graph gone."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(shape).astype(np.float32) * 4
    dense = mx.array(base)
    transposed = mx.array(np.ascontiguousarray(np.swapaxes(base, -1, -2)))
    strided = mx.array(np.stack([base, base + 1], axis=-1))
    broadcast = mx.array(base[..., :1, :])
    views = {
        "row-contiguous": dense,
        "transposed": mx.swapaxes(transposed, -1, -2),
        "strided": strided[..., 0],
        "broadcast": mx.broadcast_to(broadcast, shape),
    }
    out = []
    for name, view in views.items():
        mx.eval(view)
        copy = mx.array(np.array(view))  # the same values, row-contiguous
        out.append((name, view, copy))
    return out


def _bitwise(a, b):
    mx.eval(a, b)
    np.testing.assert_array_equal(np.array(a).view(np.uint32), np.array(b).view(np.uint32))


@pytest.mark.parametrize("op", ["sigmoid", "silu"])
def test_activations_take_views_bitwise(op):
    native = getattr(NATIVE, op)
    oracle = mx.sigmoid if op == "sigmoid" else (lambda x: x * mx.sigmoid(x))
    for name, view, copy in _views((3, 5, 37), seed=1):
        y = native(view)
        assert _nodes(y) == ["MlxgraphSilu" if op == "silu" else "MlxgraphSigmoid"], name
        _bitwise(y, native(copy))
        assert np.allclose(np.array(y), np.array(oracle(copy)), rtol=1e-6, atol=0), name


def test_attention_softmax_takes_views_bitwise():
    mask = mx.array(np.random.default_rng(2).random((1, 1, 5, 37)) < 0.8)
    sinks_dense = mx.array(np.array([0.5, -1.0, 2.0], np.float32))
    sinks_strided = mx.array(np.array([0.5, 9, -1.0, 9, 2.0, 9], np.float32))[::2]
    mx.eval(sinks_strided)
    for name, view, copy in _views((2, 3, 5, 37), seed=3):
        for causal in (False, True):
            for sinks in (None, sinks_dense, sinks_strided):
                y = NATIVE.attention_softmax(view, causal, mask, sinks)
                assert _nodes(y) == ["MlxgraphAttentionSoftmax"], name
                _bitwise(y, NATIVE.attention_softmax(copy, causal, mask, sinks_dense
                                                     if sinks is not None else None))
        want = mx.softmax(mx.where(mask, copy, -mx.inf), axis=-1)
        got = NATIVE.attention_softmax(view, False, mask, None)
        assert np.allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-7), name


def test_rms_norm_takes_views_and_a_strided_weight_bitwise():
    d = 37
    w = np.random.default_rng(4).standard_normal(d).astype(np.float32)
    w_dense = mx.array(w)
    w_strided = mx.array(np.stack([w, -w], axis=-1))[:, 0]
    w_broadcast = mx.broadcast_to(mx.array(w[:1]), (d,))
    mx.eval(w_strided, w_broadcast)
    for name, view, copy in _views((3, 5, d), seed=5):
        for weight, weight_copy in ((None, None), (w_dense, w_dense), (w_strided, w_dense),
                                    (w_broadcast, mx.array(np.full(d, w[0])))):
            y = NATIVE.rms_norm(view, weight, 1e-5)
            assert _nodes(y) == ["MlxgraphRmsNorm"], name
            _bitwise(y, NATIVE.rms_norm(copy, weight_copy, 1e-5))


def test_rope_reads_broadcast_operands_without_broadcast_nodes():
    rng = np.random.default_rng(6)
    cos = mx.array(rng.standard_normal((1, 1, 5, 64)).astype(np.float32))
    sin = mx.array(rng.standard_normal((5, 64)).astype(np.float32))
    for name, view, copy in _views((2, 3, 5, 64), seed=7):
        y = NATIVE.rope(view, cos, sin)
        assert _nodes(y) == ["MlxgraphRope"], name
        big_cos, big_sin = (mx.array(np.broadcast_to(np.array(a), (2, 3, 5, 64)).copy())
                            for a in (cos, sin))
        _bitwise(y, NATIVE.rope(copy, big_cos, big_sin))
        half = 32
        _bitwise(y, copy * cos + mx.concatenate([-copy[..., half:], copy[..., :half]], -1) * sin)
    x = mx.array(rng.standard_normal((1, 64)).astype(np.float32))  # x broadcast too
    y = NATIVE.rope(x, cos, sin)
    assert y.shape == (1, 1, 5, 64) and _nodes(y) == ["MlxgraphRope"]
    _bitwise(y, x * cos + mx.concatenate([-x[..., 32:], x[..., :32]], -1) * sin)
    with pytest.raises(ValueError):
        NATIVE.rope(x, cos, mx.zeros((3, 64)))
