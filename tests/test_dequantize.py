"""interpreter/dequantize.py: MLX's dequantize bit for bit in fewer graph nodes, and MLX's
own for everything it does not take (errors included)."""

import io
import re

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.interpreter.dequantize import dequantize


def _bits_of(a) -> np.ndarray:
    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a).view(np.uint8)


def _nodes(a) -> int:
    dot = io.StringIO()
    mx.export_to_dot(dot, a)
    return len(re.findall(r'label ="', dot.getvalue()))


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_values_are_mlx_dequantize_bit_for_bit(bits, group_size, dtype):
    w = mx.random.normal((2, 3, 5, 256), key=mx.random.key(bits * group_size)) * 7
    packed, scales, biases = mx.quantize(w.reshape(-1, 256), group_size=group_size, bits=bits)
    # Scales and biases of every sign and size (a scale of 0 and a huge bias too), as a
    # file or a quantized KV cache may hold them.
    scales = (scales * mx.random.normal(scales.shape, key=mx.random.key(1))).astype(dtype)
    biases = (biases * 1e3).astype(dtype)
    scales[0, 0], biases[1, 1] = 0, 6e4
    for lead in ((30,), (2, 3, 5)):   # an embedding's rows; a KV cache's [B, H, S]
        args = (packed.reshape(*lead, -1), scales.reshape(*lead, -1),
                biases.reshape(*lead, -1))
        mx.eval(*args)
        want = mx.dequantize(*args, group_size=group_size, bits=bits)
        got = dequantize(*args, group_size, bits)
        assert _nodes(got) <= _nodes(want) // 2   # counted before either is evaluated
        assert got.dtype == want.dtype == dtype and got.shape == want.shape
        assert np.array_equal(_bits_of(got), _bits_of(want))


def test_strided_views_of_a_packed_kv_row():
    # A quantized KV cache keeps codes, scales and biases side by side in one uint32 row
    # (interpreter/cache/kv_codec.py) and dequantizes views of it.
    w = mx.random.normal((1, 2, 9, 64), key=mx.random.key(5))
    q, s, b = mx.quantize(w, group_size=32, bits=4)
    row = mx.concatenate([q, s.view(mx.uint32), b.view(mx.uint32)], axis=-1)
    args = (row[..., :8], row[..., 8:10].view(mx.float32), row[..., 10:12].view(mx.float32))
    want = mx.dequantize(*args, group_size=32, bits=4)
    assert np.array_equal(_bits_of(dequantize(*args, 32, 4)), _bits_of(want))


def test_what_it_does_not_take_goes_to_mlx(monkeypatch):
    w = mx.random.normal((4, 192), key=mx.random.key(2))
    q3, s3, b3 = mx.quantize(w, group_size=64, bits=3)   # codes straddle words
    want = mx.dequantize(q3, s3, b3, group_size=64, bits=3)
    assert np.array_equal(_bits_of(dequantize(q3, s3, b3, 64, 3)), _bits_of(want))
    q, s, b = mx.quantize(w, group_size=64, bits=4)
    with pytest.raises(ValueError):
        dequantize(q, s[:, :2], b[:, :2], 64, 4)         # groups that do not fit the codes
    with pytest.raises(ValueError):
        dequantize(q, s, b, 0, 4)
    # Any device but the CPU: MLX's dequantize (one fused kernel there).
    calls = []
    monkeypatch.setattr(mx, "dequantize", lambda *a, **k: calls.append(k) or "mlx's")
    assert isinstance(dequantize(q, s, b, 64, 4), mx.array)
    assert not calls
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.DeviceType.gpu))
    assert dequantize(q, s, b, 64, 4) == "mlx's" and calls == [{"group_size": 64, "bits": 4}]
