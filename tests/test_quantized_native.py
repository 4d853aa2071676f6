"""The native matrix-vector kernels (interpreter/native/): the quantized one equal to MLX's own
op on every shape it takes, the float16/bfloat16 one equal to the float32 product of the
same weights; each used only where it applies, and switchable off."""

import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.interpreter.kernels.quantized import quantized_linear
from mlxgraph.interpreter.knobs import QUANTIZED_KERNEL
from mlxgraph.interpreter.native.quantized import eligible, half_eligible, native_kernel

NATIVE = native_kernel()
# The install builds the kernel wherever a C++ compiler is (this machine has one); a
# machine without one runs every QuantizedLinear on mx.quantized_matmul.
needs_native = pytest.mark.skipif(NATIVE.fn is None, reason=NATIVE.reason)


def case(rows, out_features, in_features, bits, group_size, seed=0, scales=mx.float32):
    """(x [1, rows, in], packed w, scales, biases); scales and biases in ``scales``' dtype."""
    rng = np.random.default_rng(seed)
    w = mx.array(rng.standard_normal((out_features, in_features)).astype(np.float32) * 0.05)
    x = mx.array(rng.standard_normal((1, rows, in_features)).astype(np.float32))
    q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    return x, q, s.astype(scales), b.astype(scales)


@needs_native
@pytest.mark.parametrize("bits, group_size", [(4, 64), (4, 128), (8, 32), (8, 64), (8, 128)])
@pytest.mark.parametrize("rows", [1, 2, 4, 5, 8])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("scales", [mx.float32, mx.float16])
def test_native_equals_mlx_quantized_matmul(bits, group_size, rows, threads, scales):
    """Exact against MLX's op for 1-8 rows (blocks of 4 and a remainder), float32 or
    float16 scales (MLX's op computes the float32 x against the widened scales)."""
    import mlxgraph.interpreter.native._quantized_matvec as ext

    x, w, s, b = case(rows, 300, 1024, bits, group_size, seed=bits * rows, scales=scales)
    ext.set_threads(threads)
    try:
        got = NATIVE.fn(x, w, s, b, group_size, bits)
    finally:
        ext.set_threads(NATIVE.threads)
    want = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group_size, bits=bits)
    assert got.shape == want.shape == (1, rows, 300) and got.dtype == mx.float32
    err = float(mx.abs(got - want).max()) / float(mx.abs(want).max())
    assert err < 1e-5, err


def _levels():
    if NATIVE.fn is None:
        return []
    import mlxgraph.interpreter.native._quantized_matvec as ext

    return ext.levels()


@needs_native
@pytest.mark.parametrize("level", _levels())
@pytest.mark.parametrize("bits", [4, 8])
def test_every_level_equals_the_float64_product_over_random_shapes(level, bits):
    """Each instruction-set level's code (AVX-512, AVX2, generic; those this CPU runs)
    against the dequantized weight's product in float64: every group size, 1-8 rows, odd
    and tiny row counts of W (tiles of 4 and a remainder), 1 and 2 threads (shapes big
    enough to be split), float32 and float16 scales."""
    import mlxgraph.interpreter.native._quantized_matvec as ext

    rng = np.random.default_rng(bits)
    try:
        for trial in range(24):
            group_size = (32, 64, 128)[trial % 3]
            rows = trial % 8 + 1
            n = int(rng.choice([1, 3, 5, 37, 301, 333]))
            k = group_size * int(rng.integers(1, 12)) if n < 300 else 1024
            w = mx.array(rng.standard_normal((n, k)).astype(np.float32) * 0.05)
            x = mx.array(rng.standard_normal((rows, k)).astype(np.float32))
            q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
            half = trial % 2 == 1
            s, b = (s.astype(mx.float16), b.astype(mx.float16)) if half else (s, b)
            wide = mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32),
                                 group_size=group_size, bits=bits)
            w64, x64 = np.array(wide, np.float64), np.array(x, np.float64)
            want = x64 @ w64.T
            bound = 1e-6 * (np.abs(x64) @ np.abs(w64).T) + 1e-7
            for threads in (1, 2):
                ext.set_level(level)
                ext.set_threads(threads)
                got = np.array(NATIVE.fn(x, q, s, b, group_size, bits))
                where = f"{level} q{bits} g{group_size} {rows}x{k} @ {n}x{k}.T, {threads} t"
                assert got.shape == (rows, n), where
                assert np.all(np.abs(got - want) <= bound), where
    finally:
        ext.set_level(ext.levels()[0])
        ext.set_threads(NATIVE.threads)


@needs_native
def test_levels_and_their_switch():
    import mlxgraph.interpreter.native._quantized_matvec as ext

    assert ext.levels()[-1] == "generic" and ext.level() == ext.levels()[0]
    with pytest.raises(ValueError, match="not a level this CPU runs: sse9"):
        ext.set_level("sse9")


@needs_native
def test_native_reads_strided_inputs_and_stays_lazy():
    x, w, s, b = case(2, 64, 256, 4, 64)
    xt = mx.swapaxes(mx.swapaxes(x, 1, 2), 1, 2)[:, ::-1]  # a reversed, non-contiguous view
    compiled = mx.compile(lambda v: NATIVE.fn(v, w, s, b, 64, 4))  # an evaluation would raise
    want = mx.quantized_matmul(xt, w, s, b, transpose=True, group_size=64, bits=4)
    assert float(mx.abs(compiled(xt) - want).max()) < 1e-5
    # Views reach the kernel as they are (gathered on the stream's thread): reversed rows,
    # a transposed [K, rows] buffer, a row broadcast to 3, a strided weight.
    x3 = case(3, 64, 256, 4, 64)[0]
    views = [x3[:, ::-1], mx.swapaxes(mx.array(np.array(x3[0]).T), 0, 1)[None],
             mx.broadcast_to(x3[:, :1], (1, 3, 256))]
    for v in views:
        mx.eval(v)
        want = mx.quantized_matmul(v, w, s, b, transpose=True, group_size=64, bits=4)
        assert float(mx.abs(NATIVE.fn(v, w, s, b, 64, 4) - want).max()) < 1e-5
    wide = mx.concatenate([w, w], axis=1)[:, ::2]   # a strided view of the packed weight
    want = mx.quantized_matmul(x, mx.array(np.array(wide)), s, b, transpose=True,
                               group_size=64, bits=4)
    assert float(mx.abs(NATIVE.fn(x, wide, s, b, 64, 4) - want).max()) < 1e-5


def test_eligibility():
    x, w, s, b = case(1, 16, 256, 4, 64)
    assert eligible(NATIVE, x, s, 64, 4) == (NATIVE.fn is not None)
    eight, nine = mx.zeros((1, 8, 256)), mx.zeros((4, 9, 256))
    assert eligible(NATIVE, eight, s.astype(mx.float16), 64, 4) == (NATIVE.fn is not None)
    assert not eligible(NATIVE, nine, s, 64, 4)                          # prefill: BLAS
    assert not eligible(NATIVE, x, s.astype(mx.bfloat16), 64, 4)         # bfloat16 scales
    assert not eligible(NATIVE, x.astype(mx.float16), s, 64, 4)          # half precision
    for bits in (4, 8):                                  # every format group: 16-byte blocks
        for group_size in (32, 64, 128):
            assert eligible(NATIVE, x, s, group_size, bits) == (NATIVE.fn is not None)


def test_the_kernel_gives_the_dequantized_product_on_both_paths():
    x, w, s, b = case(1, 48, 256, 8, 64, scales=mx.float16)
    bias = mx.arange(48, dtype=mx.float32)
    wide = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=64, bits=8)
    want = x @ wide.T + bias
    # native (1 and 6 rows), dequantize + matmul (12 rows): float32 out, float32 weights
    for rows in (x, mx.concatenate([x] * 6, axis=1), mx.concatenate([x] * 12, axis=1)):
        got = quantized_linear(rows, w, s, b, bias=bias, group_size=64, bits=8)
        assert got.dtype == mx.float32
        assert float(mx.abs(got - want).max()) < 1e-4


def test_switching_the_native_kernel_off():
    code = ("from mlxgraph.interpreter.native.quantized import native_kernel; "
            "print(native_kernel().describe())")
    env = {**os.environ, QUANTIZED_KERNEL.name: "mlx"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().endswith(f"otherwise mx.quantized_matmul ({QUANTIZED_KERNEL.name}=mlx)")
    assert not out.startswith("native")


# ---------------------------------------------------------------- float16 / bfloat16 Linear
def half_case(rows, dtype, out_features=300, in_features=1024, seed=0):
    rng = np.random.default_rng(seed)
    w = mx.array(rng.standard_normal((out_features, in_features)).astype(np.float32) * 0.05)
    x = mx.array(rng.standard_normal((1, rows, in_features)).astype(np.float32))
    return x.astype(dtype), w.astype(dtype)


@needs_native
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 5, 8])
@pytest.mark.parametrize("threads", [1, 2])
def test_half_native_equals_the_float32_product_of_the_same_weights(dtype, rows, threads):
    import mlxgraph.interpreter.native._quantized_matvec as ext

    x, w = half_case(rows, dtype, seed=rows)
    ext.set_threads(threads)
    try:
        got = NATIVE.half_fn(x, w)
    finally:
        ext.set_threads(NATIVE.threads)
    want = x.astype(mx.float32) @ w.astype(mx.float32).T
    assert got.dtype == mx.float32 and got.shape == want.shape == (1, rows, 300)
    # Float32 sums in another order than the BLAS: float32 rounding only.
    assert float(mx.abs(got - want).max()) <= 1e-5 * float(mx.abs(want).max())


@needs_native
def test_half_widening_is_exact_for_every_float16_value():
    """Every finite float16 bit pattern through the kernel (x one-hot): W's values come out
    as float32 exactly, subnormals and zeros included; then infinities and NaN."""
    bits = np.arange(2**16, dtype=np.uint16)
    values = bits.view(np.float16)
    finite = values[np.isfinite(values)]
    w = mx.array(finite[: finite.size // 16 * 16].reshape(-1, 16))
    for col in (0, 9):
        x = mx.array(np.eye(16, dtype=np.float16)[col][None])
        got = np.array(NATIVE.half_fn(x, w))[0]
        assert np.array_equal(got, np.array(w)[:, col].astype(np.float32))
    special = np.zeros((3, 16), np.float16)
    special[:, 3] = [np.inf, -np.inf, np.nan]
    got = np.array(NATIVE.half_fn(mx.array(np.eye(16, dtype=np.float16)[3][None]),
                                  mx.array(special)))[0]
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])


@needs_native
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_linear_takes_the_native_kernel_and_rounds_once(dtype):
    from mlxgraph.interpreter.kernels.linalg import linear

    x, w = half_case(2, dtype, seed=7)
    bias = (mx.arange(300) / 100).astype(dtype)
    assert half_eligible(NATIVE, x, w)
    got = linear(x, w, bias)
    want = (x.astype(mx.float32) @ w.astype(mx.float32).T + bias.astype(mx.float32))
    assert got.dtype == dtype
    # One rounding of the float32 result (half a unit in the last place), beside float32's
    # own summation-order noise.
    half_ulp = 2.0 ** -11 if dtype == mx.float16 else 2.0 ** -8
    bound = mx.abs(want) * half_ulp + 1e-5 * mx.abs(want).max()
    assert bool(mx.all(mx.abs(got.astype(mx.float32) - want) <= bound))


def test_half_eligibility():
    x, w = half_case(1, mx.float16, in_features=64)
    assert half_eligible_(x, w) == (NATIVE.half_fn is not None)
    assert not half_eligible_(x.astype(mx.float32), w.astype(mx.float32))   # BLAS does it
    assert not half_eligible_(x, w.astype(mx.bfloat16))                        # mixed dtypes
    assert not half_eligible_(*half_case(9, mx.float16, in_features=64))       # 9 rows
    assert not half_eligible_(*half_case(1, mx.float16, in_features=72))       # K % 16


def half_eligible_(x, w):
    return half_eligible(NATIVE, x, w)


@needs_native
def test_concurrent_callers_and_pool_resizes_get_exact_products():
    """Products from three Python threads (one on a stream of its own) share the pool one
    caller at a time while a fourth thread resizes it (1-3 threads): each product equals
    the same call made alone, bitwise (a row's sum does not depend on who computed it), and
    nothing deadlocks."""
    import threading

    import mlxgraph.interpreter.native._quantized_matvec as ext

    cases = [case(rows, n, k, bits, gs, seed=rows, scales=sd)
             for rows, n, k, bits, gs, sd in [(1, 1030, 1024, 4, 32, mx.float16),
                                              (3, 517, 1024, 8, 64, mx.float32),
                                              (8, 1201, 512, 4, 128, mx.float16)]]
    bits_gs = [(4, 32), (8, 64), (4, 128)]
    want = [np.array(NATIVE.fn(*c, gs, bits)) for c, (bits, gs) in zip(cases, bits_gs)]
    errors, stop = [], threading.Event()

    def caller(seed):
        rng = np.random.default_rng(seed)
        stream = mx.new_stream(mx.cpu) if seed == 0 else mx.default_stream(mx.cpu)
        with mx.stream(stream):
            for _ in range(150):
                i = int(rng.integers(len(cases)))
                got = np.array(NATIVE.fn(*cases[i], bits_gs[i][1], bits_gs[i][0]))
                if not np.array_equal(got, want[i]):
                    errors.append(i)

    def resizer():
        for i in range(10**6):
            if stop.is_set():
                return
            ext.set_threads(1 + i % 3)

    threads = [threading.Thread(target=caller, args=(s,), daemon=True) for s in range(3)]
    sizes = threading.Thread(target=resizer, daemon=True)
    try:
        for t in [*threads, sizes]:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a product never finished"
    finally:
        stop.set()
        sizes.join(timeout=10)
        ext.set_threads(NATIVE.threads)
    assert errors == []


@needs_native
def test_threads_are_capped_at_the_shared_pools_bound():
    """The kernels run on the one native thread pool (native/pool.c): 8 threads at most,
    and the kernel's threads() says what it uses."""
    import mlxgraph.interpreter.native._quantized_matvec as ext

    x, w, s, b = case(1, 2048, 1024, 8, 64, seed=11)
    ext.set_threads(64)
    try:
        assert ext.threads() == 8
        got = NATIVE.fn(x, w, s, b, 64, 8)
    finally:
        ext.set_threads(NATIVE.threads)
    want = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=8)
    assert float(mx.abs(got - want).max()) <= 1e-4 * float(mx.abs(want).max())
