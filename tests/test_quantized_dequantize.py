"""The native dequantize (interpreter/native/dequantize.h) that prefill-sized QuantizedLinear
steps take before the BLAS matmul: every instruction-set level against the exact float64
value of each weight (scale * code + bias from the packed codes themselves), every format
bits / group size, float32 and float16 scales, 1 and 2 threads, and its refusals."""

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.interpreter.kernels.quantized import quantized_linear
from mlxgraph.interpreter.native.quantized import dequantize_eligible, native_kernel

NATIVE = native_kernel()
needs_native = pytest.mark.skipif(NATIVE.dequantize_fn is None, reason=NATIVE.reason)


def _ext():
    import mlxgraph.interpreter.native._quantized_matvec as ext

    return ext


def exact(w, scales, biases, group_size, bits) -> np.ndarray:
    """float64 scale * code + bias, the codes read from MLX's packed uint32 words."""
    raw = np.array(w).view(np.uint8)
    codes = raw if bits == 8 else np.stack([raw & 15, raw >> 4], axis=-1).reshape(raw.shape[0], -1)
    s = np.repeat(np.array(scales.astype(mx.float32)).astype(np.float64), group_size, axis=1)
    b = np.repeat(np.array(biases.astype(mx.float32)).astype(np.float64), group_size, axis=1)
    return s * codes + b


def levels():
    return _ext().levels() if NATIVE.dequantize_fn is not None else []


@needs_native
@pytest.mark.parametrize("level", levels())
@pytest.mark.parametrize("bits, group_size", [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64),
                                              (8, 128)])
def test_every_level_is_correctly_rounded(level, bits, group_size):
    ext = _ext()
    rng = np.random.default_rng(bits * group_size)
    try:
        ext.set_level(level)
        for n, k, half, threads in [(1, 128, False, 1), (37, 384, True, 2), (300, 512, False, 2),
                                    (64, 640, True, 1)]:
            weight = mx.array(rng.standard_normal((n, k)).astype(np.float32))
            w, s, b = mx.quantize(weight, group_size=group_size, bits=bits)
            if half:
                s, b = s.astype(mx.float16), b.astype(mx.float16)
            ext.set_threads(threads)
            got = np.array(NATIVE.dequantize_fn(w, s, b, group_size, bits)).astype(np.float64)
            want = exact(w, s, b, group_size, bits)
            assert got.shape == (n, k)
            # one fused multiply-add: the float32 nearest the exact value (half an ulp)
            ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
            assert np.all(np.abs(got - want) <= 0.5 * ulp), (level, n, k, half)
    finally:
        ext.set_level(ext.levels()[0])
        ext.set_threads(NATIVE.threads)


@needs_native
def test_refusals_name_what_is_wrong():
    w, s, b = mx.quantize(mx.zeros((8, 256)), group_size=64, bits=4)
    for args, what in [
        ((w, s, b, 64, 3), "unsupported bits"),
        ((w, s, b, 16, 4), "unsupported bits or group size"),        # 8-byte groups
        ((w, s[:, :2], b[:, :2], 64, 4), "shapes do not match"),
        ((w, s.astype(mx.bfloat16), b.astype(mx.bfloat16), 64, 4), "float16 scales"),
        ((w.astype(mx.int32), s, b, 64, 4), "uint32 w"),
    ]:
        with pytest.raises(ValueError, match=what):
            NATIVE.dequantize_fn(*args)


@needs_native
def test_prefill_steps_take_it():
    rng = np.random.default_rng(7)
    w, s, b = mx.quantize(mx.array(rng.standard_normal((96, 256)).astype(np.float32)),
                          group_size=64, bits=4)
    assert dequantize_eligible(NATIVE, s, 64, 4)
    assert dequantize_eligible(NATIVE, s.astype(mx.float16), 64, 4)
    assert not dequantize_eligible(NATIVE, s.astype(mx.bfloat16), 64, 4)
    # with the tiled product on, prefill takes it (tests/test_quantized_tile.py)
    assert ("native dequantize" in NATIVE.describe()) == (NATIVE.tile_fn is None)
    x = mx.array(rng.standard_normal((1, 20, 256)).astype(np.float32))
    y = quantized_linear(x, w, s, b, bias=None, group_size=64, bits=4)
    want = np.array(x).astype(np.float64) @ exact(w, s, b, 64, 4).T
    assert float(np.max(np.abs(np.array(y) - want)) / np.max(np.abs(want))) < 1e-5
