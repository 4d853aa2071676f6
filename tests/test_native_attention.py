"""The native float32 attention softmax (interpreter/native/attention_softmax.cpp) and the
explicit attention path that uses it (interpreter/attention.py): probabilities within a few
ulp of a float64 softmax, and attention against a dense float64 attention over the full
history for many shapes (GQA, T = 1 and T > 1, causal, bool masks, sinks, softcap)."""

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.interpreter.attention import attend
from mlxgraph.interpreter.native import activations as na

NATIVE = na.native_module()
needs_native = pytest.mark.skipif(NATIVE is None, reason="native kernels not built")


def _softmax64(scores, causal, mask, sinks):
    """The float64 oracle: masked softmax with a sink column, [B, H, T, S]."""
    b, h, t, s = scores.shape
    allowed = np.ones(scores.shape, bool)
    if causal:
        allowed &= np.arange(s)[None, :] <= np.arange(s - t, s)[:, None]
    if mask is not None:
        allowed &= np.broadcast_to(mask, scores.shape)
    x = np.where(allowed, scores.astype(np.float64), -np.inf)
    if sinks is not None:
        column = np.broadcast_to(sinks.astype(np.float64).reshape(1, h, 1, 1), (b, h, t, 1))
        x = np.concatenate([x, column], axis=-1)
    with np.errstate(invalid="ignore"):
        x = x - x.max(axis=-1, keepdims=True)
        w = np.exp(x)
        w /= w.sum(axis=-1, keepdims=True)
    return w[..., :s]


def _dense_attention(q, k, v, scale, causal, mask, sinks, softcap):
    """Attention in float64 over the whole history, K/V heads repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    k64 = np.repeat(k.astype(np.float64), group, axis=1)
    v64 = np.repeat(v.astype(np.float64), group, axis=1)
    scores = np.einsum("bhtd,bhsd->bhts", q.astype(np.float64), k64) * scale
    if softcap:
        scores = np.tanh(scores / softcap) * softcap
    return np.einsum("bhts,bhsv->bhtv", _softmax64(scores, causal, mask, sinks), v64)


SHAPES = [(1, 1, 1, 1), (1, 3, 1, 17), (2, 4, 5, 33), (1, 16, 128, 128), (1, 2, 3, 1000),
          (2, 1, 7, 7), (1, 2, 16, 16), (1, 1, 20, 48)]


@needs_native
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_within_a_few_ulp_of_float64(shape):
    rng = np.random.default_rng(sum(shape))
    b, h, t, s = shape
    worst = 0.0
    for causal in (False, True):
        for mask in (None, rng.random((t, s)) > 0.3, rng.random((b, 1, t, s)) > 0.5):
            for sinks in (None, rng.standard_normal(h).astype(np.float32) * 3):
                x = (rng.standard_normal(shape) * 12).astype(np.float32)  # spreads up to ~100
                got = np.array(NATIVE.attention_softmax(
                    mx.array(x), causal, None if mask is None else mx.array(mask),
                    None if sinks is None else mx.array(sinks)))
                want = _softmax64(x, causal, mask, sinks)
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
                normal = np.nan_to_num(want) > np.finfo(np.float32).tiny
                spacing = np.spacing(want[normal].astype(np.float32)).astype(np.float64)
                if normal.any():
                    worst = max(worst, np.max(np.abs(got[normal] - want[normal]) / spacing))
                small = ~normal & ~np.isnan(want)
                assert np.all(np.abs(got[small] - want[small]) < 1e-44)
    assert worst <= 4, worst


@needs_native
def test_softmax_special_rows():
    inf, nan = np.inf, np.nan
    x = np.array([[[[1.0, 2.0, 3.0],        # masked entirely (mask row 0): no key
                    [1.0, nan, 3.0],        # a NaN score: NaN row, as a float64 softmax
                    [1.0, inf, 3.0],        # +inf: inf - inf = NaN row
                    [-inf, 0.0, -inf],      # -inf scores weigh 0
                    [nan, 5.0, 5.0]]]],     # NaN where masked out: ignored
                 np.float32)
    mask = np.array([[0, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1], [0, 1, 1]], bool)
    for sinks in (None, np.array([0.5], np.float32)):
        got = np.array(NATIVE.attention_softmax(mx.array(x), False, mx.array(mask),
                                                None if sinks is None else mx.array(sinks)))
        want = _softmax64(x, False, mask, sinks)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="causal"):
        NATIVE.attention_softmax(mx.zeros((1, 1, 3, 2)), True, None, None)
    with pytest.raises(ValueError, match="bool"):
        NATIVE.attention_softmax(mx.zeros((1, 1, 2, 2)), False, mx.zeros((2, 2)), None)
    with pytest.raises(ValueError, match="sinks"):
        NATIVE.attention_softmax(mx.zeros((1, 2, 2, 2)), False, None, mx.zeros((3,)))


@needs_native
def test_strided_scores_and_mask():
    rng = np.random.default_rng(5)
    base = mx.array(rng.standard_normal((1, 2, 6, 20)).astype(np.float32))
    scores = base[..., ::2]                               # strided: made contiguous first
    mask = mx.array(rng.random((10, 6)) > 0.4).T          # transposed: gathered per row
    got = np.array(NATIVE.attention_softmax(scores, False, mask, None))
    want = _softmax64(np.array(scores), False, np.array(mask), None)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)


def _case(rng, b, hkv, group, t, s, d, dv):
    q = rng.standard_normal((b, hkv * group, t, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, s, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, s, dv)).astype(np.float32)
    return q, k, v


@needs_native
def test_attention_matches_dense_float64(monkeypatch):
    calls = []
    real = NATIVE.attention_softmax
    monkeypatch.setattr(NATIVE, "attention_softmax", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(11)
    cases = 0
    for b, hkv, group, t, s, d, dv in [(1, 2, 4, 1, 1, 16, 16), (1, 2, 4, 1, 300, 64, 64),
                                       (2, 1, 8, 5, 40, 32, 24), (1, 4, 1, 64, 64, 64, 64),
                                       (1, 2, 2, 17, 50, 8, 40), (3, 3, 2, 2, 9, 16, 16)]:
        q, k, v = _case(rng, b, hkv, group, t, s, d, dv)
        for mask_kind in ("none", "causal", "bool", "batch-bool"):
            mask = {"none": None, "causal": "causal", "bool": rng.random((t, s)) > 0.3,
                    "batch-bool": rng.random((b, 1, t, s)) > 0.3}[mask_kind]
            for sinks in (None, rng.standard_normal(hkv * group).astype(np.float32)):
                for softcap in (0.0, 5.0):
                    scale = d ** -0.5
                    mx_mask = mask if mask is None or isinstance(mask, str) else mx.array(mask)
                    got = attend(mx.array(q), mx.array(k), mx.array(v), mx_mask, scale,
                                 mx.float32, sinks=None if sinks is None else mx.array(sinks),
                                 softcap=softcap)
                    causal = isinstance(mask, str)
                    want = _dense_attention(q, k, v, scale, causal, None if causal else mask,
                                            sinks, softcap)
                    got = np.array(got)
                    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
                    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
                    cases += 1
    assert len(calls) == cases  # every float32 case took the native softmax


@needs_native
def test_other_dtypes_and_additive_masks_take_mlx_fused(monkeypatch):
    monkeypatch.setattr(NATIVE, "attention_softmax", None)  # would fail if called
    rng = np.random.default_rng(2)
    q, k, v = (mx.array(a) for a in _case(rng, 1, 2, 2, 3, 8, 16, 16))
    half = [a.astype(mx.float16) for a in (q, k, v)]
    got = attend(*half, "causal", 0.25, mx.float16)
    want = mx.fast.scaled_dot_product_attention(*half, scale=0.25, mask="causal")
    np.testing.assert_array_equal(np.array(got), np.array(want))
    additive = mx.array(rng.standard_normal((3, 8)).astype(np.float32))
    got = attend(q, k, v, additive, 0.25, mx.float32)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=additive)
    np.testing.assert_array_equal(np.array(got), np.array(want))

