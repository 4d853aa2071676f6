"""The quantized prefill product (interpreter/native/quantized_tile.h): a packed weight
dequantized a tile at a time under tile_gemm's blocking and micro-kernel gives, bit for bit,
what the old path gave where the router took its tile kernel (the whole weight dequantized,
then tile_gemm); elsewhere the old path's BLAS sgemm, within float32 rounding. Its
refusals, its switch, and q4 and q8 graphs' prefill logits with it on and off."""

import ctypes
import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np
import pytest
from blas_helpers import has_avx512
from conftest import tiny_hf_model

from mlxgraph.interpreter.kernels.quantized import quantized_linear
from mlxgraph.interpreter.knobs import QUANTIZED_PREFILL, KnobError
from mlxgraph.interpreter.native.blas_router import router_file
from mlxgraph.interpreter.native.quantized import native_kernel, tile_eligible

NATIVE = native_kernel()
needs_tile = pytest.mark.skipif(NATIVE.tile_fn is None,
                                reason=NATIVE.tile_reason or NATIVE.reason)


def _ext():
    from mlxgraph.interpreter.native.mlx_extension import import_mlx_extension

    return import_mlx_extension("_quantized_matvec")[0]


def tile_gemm(x: np.ndarray, w: np.ndarray, threads: int = 1) -> np.ndarray:
    """x @ w.T by the router's tile_gemm itself (the old path's kernel for 9..160 rows)."""
    lib = ctypes.CDLL(router_file())
    lib.tile_gemm.argtypes = [ctypes.c_int] * 3 + [
        ctypes.c_float, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
        ctypes.c_long, ctypes.c_long, ctypes.c_float, ctypes.c_void_p, ctypes.c_long,
        ctypes.c_long, ctypes.c_int]
    x, w = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(w, np.float32)
    (m, k), n = x.shape, w.shape[0]
    out = np.zeros((m, n), np.float32)
    assert lib.tile_gemm(m, n, k, 1.0, x.ctypes.data, k, 1, w.ctypes.data, k, 1, 0.0,
                         out.ctypes.data, n, 1, threads) == 0
    return out


def packed(n, k, bits, group_size, scales, seed):
    rng = np.random.default_rng(seed)
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32) * 0.05)
    q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    return q, s.astype(scales), b.astype(scales)


# (rows, N, K): N no multiple of the 12-row tile, K over 1024 (k blocks of 939 and 576, which
# start inside a group and, at 4 bits, inside a byte), passes of 128 rows and a last panel
# of 16 rows or fewer.
SHAPES = [(5, 13, 128), (9, 100, 256), (37, 1030, 1152), (130, 300, 2816), (300, 77, 384),
          (161, 24, 640)]


@needs_tile
@pytest.mark.skipif(not router_file() or not has_avx512(), reason="the router's tile_gemm")
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scales", [mx.float32, mx.float16])
def test_equals_tile_gemm_on_the_dequantized_weight(bits, group_size, scales):
    ext = _ext()
    try:
        for i, (m, n, k) in enumerate(SHAPES):
            if k % group_size:
                continue
            q, s, b = packed(n, k, bits, group_size, scales, seed=i)
            x = np.random.default_rng(i).standard_normal((m, k)).astype(np.float32)
            want = tile_gemm(x, np.array(NATIVE.dequantize_fn(q, s, b, group_size, bits)))
            for threads in (1, 2):
                ext.set_threads(threads)
                got = NATIVE.tile_fn(mx.array(x), q, s, b, group_size, bits)
                assert got.dtype == mx.float32 and got.shape == (m, n)
                assert np.array_equal(np.array(got), want), (m, n, k, threads)
    finally:
        ext.set_threads(NATIVE.threads)


@needs_tile
@pytest.mark.skipif(not router_file() or not has_avx512(), reason="the router's tile_gemm")
@pytest.mark.parametrize("level", _ext().levels() if NATIVE.tile_fn is not None else [])
def test_every_dequantize_level_gives_the_same_bits(level):
    """The tiles' dequantize follows set_level (AVX-512 or the plain loop): one fused
    multiply-add per weight either way, so the same product."""
    ext = _ext()
    q, s, b = packed(100, 2048, 4, 64, mx.float16, seed=3)
    x = np.random.default_rng(3).standard_normal((40, 2048)).astype(np.float32)
    want = tile_gemm(x, np.array(NATIVE.dequantize_fn(q, s, b, 64, 4)))
    try:
        ext.set_level(level)
        got = np.array(NATIVE.tile_fn(mx.array(x), q, s, b, 64, 4))
    finally:
        ext.set_level(ext.levels()[0])
    assert np.array_equal(got, want)


@needs_tile
def test_views_and_batches_read_as_their_rows():
    q, s, b = packed(50, 256, 8, 32, mx.float32, seed=4)
    x = mx.array(np.random.default_rng(4).standard_normal((2, 256, 30)).astype(np.float32))
    view = x.transpose(0, 2, 1)   # [2, 30, 256], not row-contiguous
    got = NATIVE.tile_fn(view, q, s, b, 32, 8)
    want = NATIVE.tile_fn(mx.array(np.array(view)), q, s, b, 32, 8)
    assert got.shape == (2, 30, 50)
    assert np.array_equal(np.array(got), np.array(want))
    rows = NATIVE.tile_fn(mx.array(np.array(view).reshape(60, 256)), q, s, b, 32, 8)
    assert np.array_equal(np.array(got).reshape(60, 50), np.array(rows))


@needs_tile
@pytest.mark.parametrize("bits, scales", [(4, mx.float16), (8, mx.float32)])
def test_equals_the_old_path_within_float32_rounding(bits, scales):
    """Against the whole dequantized weight under MLX's matmul (the router's tile kernel or
    the BLAS's sgemm, as it picks): every shape, rows 5..300."""
    for i, (m, n, k) in enumerate(SHAPES):
        q, s, b = packed(n, k, bits, 64, scales, seed=10 + i)
        x = mx.array(np.random.default_rng(i).standard_normal((1, m, k)).astype(np.float32))
        wide = NATIVE.dequantize_fn(q, s, b, 64, bits)
        got = np.array(quantized_linear(x, q, s, b, bias=None, group_size=64, bits=bits))
        old = np.array(mx.matmul(x, wide.T))
        exact = np.array(x).astype(np.float64) @ np.array(wide).astype(np.float64).T
        bound = k * np.finfo(np.float32).eps * (np.abs(np.array(x)).astype(np.float64)
                                                @ np.abs(np.array(wide)).astype(np.float64).T)
        assert np.all(np.abs(got - exact) <= bound) and np.all(np.abs(old - exact) <= bound)


@needs_tile
def test_prefill_sized_steps_take_it():
    q, s, b = packed(64, 256, 4, 64, mx.float16, seed=5)
    for rows, taken in [(1, False), (4, False), (5, True), (300, True)]:
        assert tile_eligible(NATIVE, mx.zeros((1, rows, 256)), s, 64, 4) == taken
    assert not tile_eligible(NATIVE, mx.zeros((1, 20, 256), dtype=mx.float16), s, 64, 4)
    assert not tile_eligible(NATIVE, mx.zeros((1, 20, 256)), s.astype(mx.bfloat16), 64, 4)
    assert "native tiled product" in NATIVE.describe()


@needs_tile
def test_refusals_name_what_is_wrong():
    q, s, b = packed(8, 256, 4, 64, mx.float32, seed=6)
    x = mx.zeros((20, 256))
    for args, what in [
        ((x.astype(mx.float16), q, s, b, 64, 4), "float32 x"),
        ((mx.zeros((20, 128)), q, s, b, 64, 4), "shapes do not match"),
        ((x, q, s, b, 64, 3), "unsupported bits"),
        ((x, q, s.astype(mx.bfloat16), b.astype(mx.bfloat16), 64, 4), "float16 scales"),
    ]:
        with pytest.raises(ValueError, match=what):
            NATIVE.tile_fn(*args)


def _describe(env_extra: dict) -> subprocess.CompletedProcess:
    code = ("from mlxgraph.interpreter.native.quantized import native_kernel; "
            "print(native_kernel().describe())")
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env_extra},
                          capture_output=True, text=True, timeout=120)


@needs_tile
def test_switching_it_off_keeps_the_dequantize_path():
    out = _describe({QUANTIZED_PREFILL.name: "off"})
    assert out.returncode == 0, out.stderr
    assert f"native dequantize + BLAS matmul ({QUANTIZED_PREFILL.name}=off)" in out.stdout
    bad = _describe({QUANTIZED_PREFILL.name: "sometimes"})
    assert bad.returncode != 0 and "MLXGRAPH_QUANTIZED_PREFILL=sometimes" in bad.stderr
    with pytest.raises(KnobError):
        QUANTIZED_PREFILL.read({QUANTIZED_PREFILL.name: "sometimes"})


_PREFILL = textwrap.dedent("""
    import sys
    import mlxgraph
    mlxgraph.preload_blas()
    import mlx.core as mx
    import numpy as np
    program = mlxgraph.load(sys.argv[1])
    session = program.session(capacity=64, max_step=48)
    tokens = [int(t) for t in np.random.default_rng(0).integers(4, 200, 40)]
    np.save(sys.argv[2], np.array(session.step([tokens], range(len(tokens)))))
""")


@pytest.fixture(scope="module")
def quantized_graphs(tmp_path_factory):
    from mlxgraph.exporter import export
    from mlxgraph.exporter.pipeline import QuantizeRecipe

    folder = tmp_path_factory.mktemp("quantized-tile")
    paths = {}
    for name, recipe in [("q4", QuantizeRecipe("q4", 32)), ("q8", QuantizeRecipe("q8", 32))]:
        paths[name] = folder / f"{name}.mlxg"
        export(tiny_hf_model("llama"), paths[name], max_seq_len=64, quantize=recipe)
    return folder, paths


def _prefill_logits(folder, path, env_extra: dict) -> np.ndarray:
    out = folder / "logits.npy"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXGRAPH_BLAS_TILE")}
    done = subprocess.run([sys.executable, "-c", _PREFILL, str(path), str(out)],
                          env={**env, **env_extra}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return np.load(out)


@needs_tile
@pytest.mark.skipif(not router_file() or not has_avx512(), reason="the router's tile_gemm")
@pytest.mark.parametrize("name", ["q4", "q8"])
def test_graph_prefill_logits_are_those_of_the_old_path(quantized_graphs, name):
    """A 40-token prefill of a q4 and a q8 graph: with every float32 product of many rows on
    the router's tile kernel (MLXGRAPH_BLAS_TILE=always), the old path's logits bit for bit;
    with the router's own choice, within float32 rounding of them."""
    folder, paths = quantized_graphs
    tiled = {"MLXGRAPH_BLAS_TILE": "always"}
    new = _prefill_logits(folder, paths[name], {**tiled, QUANTIZED_PREFILL.name: "on"})
    old = _prefill_logits(folder, paths[name], {**tiled, QUANTIZED_PREFILL.name: "off"})
    assert new.shape[-2] == 40 and np.all(np.isfinite(new))
    assert np.array_equal(new, old)
    default_old = _prefill_logits(folder, paths[name], {QUANTIZED_PREFILL.name: "off"})
    assert np.allclose(new, default_old, rtol=1e-4, atol=1e-4 * np.abs(default_old).max())
