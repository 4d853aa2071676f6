"""The native float32 sigmoid and SiLU (interpreter/native/activations.cpp): within a few ulp
of a float64 oracle over the whole float range (special values included), used by the
Sigmoid and Silu kernels for float32 on the CPU only, and switchable off (with the attention
softmax of tests/test_native_attention.py and the RMSNorm and RoPE of
tests/test_native_norm_rope.py)."""

import os
import shutil
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.interpreter.kernels.elementwise import silu as silu_kernel
from mlxgraph.interpreter.knobs import NATIVE_ACTIVATIONS
from mlxgraph.interpreter.native import activations as na

NATIVE = na.native_module()
HAS_CXX = any(shutil.which(c) for c in ("c++", "g++", "clang++"))
needs_native = pytest.mark.skipif(NATIVE is None, reason="native activations not built")


def test_built_where_a_compiler_is():
    if HAS_CXX and NATIVE_ACTIVATIONS.read():
        assert NATIVE is not None, "a C++ compiler is present but the install did not build it"


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e-45, -1e-45, 87.3,
                -87.3, 88.8, -88.8, 99.9, -99.9, 100.0, -100.0, 104.0, -104.0, 3e38, -3e38]
    return np.concatenate([
        np.linspace(-110, 110, 400_001),  # every region of the range reduction
        rng.standard_normal(50_000) * 3,  # where activations live
        np.array(specials),
    ]).astype(np.float32)


def _ulp_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest error in units of the float32 spacing at the exact value (normal results)."""
    normal = np.abs(want) > np.finfo(np.float32).tiny
    spacing = np.spacing(np.abs(want[normal]).astype(np.float32)).astype(np.float64)
    return float(np.max(np.abs(got[normal] - want[normal]) / spacing))


@needs_native
def test_sigmoid_and_silu_within_a_few_ulp_of_float64():
    x = _inputs()
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        sig = 1.0 / (1.0 + np.exp(-x64))
        silu = x64 * sig
    got_sig = np.array(NATIVE.sigmoid(mx.array(x))).astype(np.float64)
    got_silu = np.array(NATIVE.silu(mx.array(x))).astype(np.float64)
    finite = np.isfinite(x)
    assert _ulp_error(got_sig[finite], sig[finite]) <= 4
    assert _ulp_error(got_silu[finite], silu[finite]) <= 5
    # subnormal results: within a few subnormal steps
    assert np.max(np.abs(got_sig[finite] - sig[finite])) < 4 * 2**-24
    assert np.max(np.abs(got_silu[finite] - silu[finite])[np.abs(silu[finite]) < 1e-38]) < 1e-44
    # NaN stays NaN; infinities as MLX's own ops give them (silu(-inf) = -inf * 0 = NaN)
    special = mx.array(np.array([np.nan, np.inf, -np.inf], np.float32))
    pairs = ((NATIVE.sigmoid, mx.sigmoid), (NATIVE.silu, lambda v: v * mx.sigmoid(v)))
    for native, mlx_op in pairs:
        np.testing.assert_array_equal(np.array(native(special)), np.array(mlx_op(special)))


@needs_native
@pytest.mark.parametrize("shape", [(1,), (15,), (16,), (17,), (3, 1, 2816), (0, 4)])
def test_any_shape_and_strided_input(shape):
    rng = np.random.default_rng(1)
    base = mx.array(rng.standard_normal((*shape[:-1], shape[-1] * 2)).astype(np.float32) * 4)
    x = base[..., ::2]  # a strided view: the primitive makes it contiguous first
    want = np.array(x * mx.sigmoid(x))
    got = np.array(NATIVE.silu(x))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@needs_native
def test_kernels_use_it_for_float32_only():
    x = mx.array(np.linspace(-8, 8, 33, dtype=np.float32))
    # float32: the native primitive's exact result; bfloat16: MLX's own op, dtype kept
    np.testing.assert_array_equal(np.array(silu_kernel(x)), np.array(NATIVE.silu(x)))
    xb = x.astype(mx.bfloat16)
    got = silu_kernel(xb)
    assert got.dtype == mx.bfloat16
    np.testing.assert_array_equal(np.array(got.astype(mx.float32)),
                                  np.array((xb * mx.sigmoid(xb)).astype(mx.float32)))
    # integer input computes in float32, as torch does
    assert silu_kernel(mx.array([1, 2, 3])).dtype == mx.float32


def test_switch_off_takes_mlx_ops():
    # attention then runs on MLX's fused kernel, RMSNorm on mx.fast.rms_norm, RoPE on the
    # MLX ops (bitwise their results)
    code = (
        "import mlx.core as mx, numpy as np\n"
        "from mlxgraph.interpreter.native import activations as na\n"
        "from mlxgraph.interpreter.attention import attend\n"
        "from mlxgraph.interpreter.kernels.fused import rms_norm, rope\n"
        "q, k, v = (mx.array(np.random.default_rng(i).standard_normal((1, 4, 3, 16)),\n"
        "                    mx.float32) for i in range(3))\n"
        "got = attend(q, k, v, 'causal', 0.25, mx.float32)\n"
        "want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask='causal')\n"
        "same = [mx.array_equal(got, want)]\n"
        "same.append(mx.array_equal(rms_norm(q, k[0, 0, 0], 1e-6),\n"
        "                           mx.fast.rms_norm(q, k[0, 0, 0], 1e-6)))\n"
        "rot = mx.concatenate([-q[..., 8:], q[..., :8]], axis=-1)\n"
        "same.append(mx.array_equal(rope(q, k, v), q * k + rot * v))\n"
        "print(all(bool(s) for s in same), na.native_module() is None, na.describe())\n"
    )
    env = dict(os.environ, **{NATIVE_ACTIVATIONS.name: "0"})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("True True MLX's sigmoid, softmax, RMSNorm and RoPE ops")
