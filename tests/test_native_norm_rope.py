"""The native float32 RMSNorm and RoPE (interpreter/native/norm_rope.cpp): at every
instruction-set level against a float64 numpy oracle (RMSNorm relative error at most
3 * 2^-24, the three float32 roundings of x * r * w; RoPE bitwise MLX's own ops and within
2^-23 of |x1 c| + |x2 s| of the float64 value), over many shapes and layouts (1 and many
tokens, odd sizes, head_dim 64/128/odd halves, strided and broadcast views), and the fused
kernels' choice: native only for float32 on the CPU, MLX's ops for everything else."""

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.interpreter.kernels.fused import rms_norm as rms_kernel
from mlxgraph.interpreter.kernels.fused import rope as rope_kernel
from mlxgraph.interpreter.native import activations as na

NATIVE = na.native_module()
needs_native = pytest.mark.skipif(NATIVE is None, reason="native kernels not built")
LEVELS = NATIVE.levels() if NATIVE is not None else []
RMS_BOUND = 3 * 2.0**-24 * (1 + 1e-6)   # three roundings (r, x * r, * w), float64 r


@pytest.fixture(params=LEVELS)
def level(request):
    NATIVE.set_level(request.param)
    yield request.param
    NATIVE.set_level(LEVELS[0])


def _rms64(x, w, eps):
    x64 = np.asarray(x, np.float64)
    r = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + np.float64(np.float32(eps)))
    y = x64 * r
    return y if w is None else y * np.asarray(w, np.float64)


def _rope_mlx(x, cos, sin):
    """Today's MLX-op code (the fused kernel with the switch off)."""
    d = x.shape[-1]
    return x * cos + mx.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1) * sin


RMS_SHAPES = [(1,), (7,), (16,), (17,), (1, 1, 1024), (1, 128, 1024), (3, 5, 33), (2, 1, 2816),
              (4, 130), (1, 9, 4, 64)]


@needs_native
@pytest.mark.parametrize("shape", RMS_SHAPES)
def test_rms_norm_within_three_roundings_of_float64(level, shape):
    rng = np.random.default_rng(sum(shape))
    scale = np.exp(rng.uniform(-20, 20, shape[:-1] + (1,)))  # rows of very different sizes
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    w = (rng.standard_normal(shape[-1]) * 2).astype(np.float32)
    for weight in (None, w):
        for eps in (1e-6, 1e-5, 0.3):
            got = np.array(NATIVE.rms_norm(mx.array(x), None if weight is None
                                           else mx.array(weight), eps))
            want = _rms64(x, weight, eps)
            assert got.dtype == np.float32 and got.shape == want.shape
            bound = RMS_BOUND * np.abs(want) + 1e-37  # subnormal results: absolute
            assert np.all(np.abs(got - want) <= bound), (level, shape, eps)


@needs_native
def test_rms_norm_strided_rows_and_special_values(level):
    rng = np.random.default_rng(3)
    base = mx.array(rng.standard_normal((4, 6, 70)).astype(np.float32))
    w = mx.array(rng.standard_normal(35).astype(np.float32))
    for view in (base[..., ::2], mx.swapaxes(base, 0, 1)[..., 1::2],
                 mx.broadcast_to(base[:1, :1, :35], (3, 2, 35))):
        want = _rms64(np.array(view), np.array(w), 1e-6)
        got = np.array(NATIVE.rms_norm(view, w, 1e-6))
        assert np.all(np.abs(got - want) <= RMS_BOUND * np.abs(want) + 1e-37)
    # a float32 sum of squares overflows (torch's, MLX's): 0, and NaN for inf; NaN spreads
    rows = np.array([[3e19, 1.0, -2.0, 0.0], [np.inf, 1.0, 2.0, 3.0], [np.nan, 1.0, 0.0, 2.0],
                     [0.0, 0.0, 0.0, 0.0]], np.float32)
    x, w4 = mx.array(rows), mx.array(np.array([1.0, -2.0, 0.5, 3.0], np.float32))
    got, want = NATIVE.rms_norm(x, w4, 1e-6), mx.fast.rms_norm(x, w4, 1e-6)
    np.testing.assert_array_equal(np.array(got), np.array(want))


ROPE_CASES = [  # (x shape before the head transpose [B, T, H, D], cos/sin shape)
    ((1, 1, 16, 64), (1, 1, 1, 64)), ((1, 128, 16, 64), (1, 1, 128, 64)),
    ((2, 5, 4, 128), (2, 1, 5, 128)), ((1, 7, 3, 34), (1, 7, 34)), ((1, 3, 2, 2), (3, 2)),
    ((1, 9, 2, 6), (1, 1, 9, 6)), ((3, 17, 1, 96), (1, 1, 17, 96)), ((1, 4, 5, 130), (4, 130)),
]


@needs_native
@pytest.mark.parametrize("xshape, cshape", ROPE_CASES)
def test_rope_bitwise_mlx_ops_and_close_to_float64(level, xshape, cshape):
    rng = np.random.default_rng(sum(xshape) + len(cshape))
    x = mx.swapaxes(mx.array(rng.standard_normal(xshape).astype(np.float32) * 8), 1, 2)
    ang = rng.uniform(0, 100, cshape)
    cos, sin = mx.array(np.cos(ang).astype(np.float32)), mx.array(np.sin(ang).astype(np.float32))
    got = NATIVE.rope(x, cos, sin)
    want = _rope_mlx(x, cos, sin)
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_array_equal(np.array(got), np.array(want))
    x64, c64, s64 = (np.array(a, np.float64) for a in (x, cos, sin))
    h = x64.shape[-1] // 2
    rot = np.concatenate([-x64[..., h:], x64[..., :h]], axis=-1)
    exact = x64 * c64 + rot * s64
    bound = 2.0**-23 * (np.abs(x64 * c64) + np.abs(rot * s64)) + 1e-37
    assert np.all(np.abs(np.array(got, np.float64) - exact) <= bound)


@needs_native
def test_rope_strided_broadcast_and_special_values(level):
    rng = np.random.default_rng(9)
    base = mx.array(rng.standard_normal((2, 3, 5, 16)).astype(np.float32))
    c = mx.array(rng.standard_normal((5, 8)).astype(np.float32))
    s = mx.array(rng.standard_normal((5, 16)).astype(np.float32))
    cases = [(base[..., ::2], c, s[:, ::2]),                      # strided last axes
             (base[:, :1, ::-1], mx.broadcast_to(s[:, :1], (5, 16)), s),  # reversed, stride 0
             (base[0, 0, 0], base[1, 1], base[1, 2])]             # x broadcast to cos's rows
    for x, cos, sin in cases:
        np.testing.assert_array_equal(np.array(NATIVE.rope(x, cos, sin)),
                                      np.array(_rope_mlx(x, cos, sin)))
    special = mx.array(np.array([[np.inf, 1.0, np.nan, -0.0], [3e38, -3e38, 1e-45, 0.0]],
                                np.float32))
    trig = mx.array(np.array([0.5, 0.0, -1.0, 2.0], np.float32))
    got, want = np.array(NATIVE.rope(special, trig, trig)), np.array(_rope_mlx(special, trig,
                                                                               trig))
    np.testing.assert_array_equal(got, want)  # NaN where MLX's ops give NaN, same infinities
    with pytest.raises(ValueError, match="even"):
        NATIVE.rope(mx.zeros((2, 3)), mx.zeros((3,)), mx.zeros((3,)))
    with pytest.raises(ValueError, match="float32"):
        NATIVE.rms_norm(mx.zeros((2, 3), mx.float16), None, 1e-6)
    with pytest.raises(ValueError, match="weight"):
        NATIVE.rms_norm(mx.zeros((2, 3)), mx.zeros((4,)), 1e-6)
    with pytest.raises(ValueError, match="not a level this CPU runs: sse9"):
        NATIVE.set_level("sse9")


@needs_native
def test_fused_kernels_take_native_for_float32_only(monkeypatch):
    calls = []
    for name in ("rms_norm", "rope"):
        real = getattr(NATIVE, name)
        monkeypatch.setattr(NATIVE, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    rng = np.random.default_rng(4)
    x = mx.array(rng.standard_normal((1, 3, 40)).astype(np.float32))
    w = mx.array(rng.standard_normal(40).astype(np.float32))
    xf = np.array(x)
    # float32 x with a float32, bfloat16 or Gemma-offset weight: native, the same roundings
    for weight, offset in ((w, 0.0), (w.astype(mx.bfloat16), 0.0), (w, 1.0), (None, 0.0)):
        wide = None if weight is None else np.array(weight.astype(mx.float32))
        if offset:
            wide = (wide + np.float32(offset)).astype(np.float32)
        got = np.array(rms_kernel(x, weight, 1e-6, offset))
        want = _rms64(xf, wide, 1e-6)
        assert np.all(np.abs(got - want) <= RMS_BOUND * np.abs(want) + 1e-37)
    cos, sin = mx.cos(x), mx.sin(x)
    np.testing.assert_array_equal(np.array(rope_kernel(x, cos, sin)),
                                  np.array(_rope_mlx(x, cos, sin)))
    assert calls == ["rms_norm"] * 4 + ["rope"]
    # everything else: MLX's own ops, as before
    calls.clear()
    xb = x.astype(mx.bfloat16)
    assert rms_kernel(xb, w.astype(mx.bfloat16), 1e-6).dtype == mx.bfloat16
    assert rms_kernel(x, w.astype(mx.float64), 1e-6, 0.0).dtype == mx.float64
    with pytest.raises(ValueError, match="dimension"):
        rms_kernel(x, w.reshape(1, 40), 1e-6)                            # weight not [D]
    assert rope_kernel(xb, cos.astype(mx.bfloat16), sin.astype(mx.bfloat16)).dtype == mx.bfloat16
    assert rope_kernel(x, cos.astype(mx.float16), sin).dtype == mx.float32  # promoted by MLX
    with pytest.raises(ValueError, match="even"):
        rope_kernel(x[..., :39], cos[..., :39], sin[..., :39])
    with pytest.raises(ValueError):
        rope_kernel(x, cos[:, :2], sin)                                  # does not broadcast
    assert calls == []
