"""int8 activations (Program.load's int8_activations, interpreter/native/int8_kernel.h): the
kernel computes, at every instruction-set level, exactly the float64 product of x rounded to
int8 per 32 values (this test's own rounding) with the packed weight; a graph loaded with the
option runs it and stays close to the exact graph; the option is refused where it would do
nothing."""

import json

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.exporter import export
from mlxgraph.exporter.quantize import QuantizeRecipe
from mlxgraph.interpreter.kernels.quantized import quantized_linear, quantized_linear_int8
from mlxgraph.interpreter.native.quantized import int8_eligible, native_kernel
from mlxgraph.interpreter.program import Program

NATIVE = native_kernel()
needs_native = pytest.mark.skipif(NATIVE.int8_fn is None, reason=NATIVE.reason)


def _ext():
    import mlxgraph.interpreter.native._quantized_matvec as ext

    return ext


def _levels():
    return _ext().int8_levels() if NATIVE.int8_fn is not None else []


def rounded_product(x, q, s, b, group_size, bits):
    """float64 y and the magnitude sum |x||w| per output: x rounded as the kernel's contract
    says (d = max|x| / 127 per 32 values in float32, q = rint(x / d)), the weight exact, the
    bias term against the float32 per-group sums of x."""
    s32 = np.array(s.astype(mx.float32), np.float64)
    b32 = np.array(b.astype(mx.float32), np.float64)
    w = np.array(mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32),
                               group_size=group_size, bits=bits), np.float64)
    codes = np.rint((w - np.repeat(b32, group_size, 1)) / np.repeat(s32, group_size, 1))
    scaled = codes * np.repeat(s32, group_size, 1)
    xf = np.array(x, np.float32).reshape(-1, x.shape[-1])
    blocks = xf.reshape(xf.shape[0], -1, 32)
    d = (np.abs(blocks).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))
    xq = np.where(d > 0, np.rint(blocks / safe), 0) * d.astype(np.float64)
    xq = xq.reshape(xf.shape)
    sums = xf.astype(np.float64).reshape(xf.shape[0], -1, group_size).sum(-1)
    y = xq @ scaled.T + sums @ b32.T
    magnitude = np.abs(xq) @ np.abs(scaled).T + np.abs(sums) @ np.abs(b32).T
    return y, magnitude


def case(rows, n, k, bits, group_size, seed, scales=mx.float16):
    rng = np.random.default_rng(seed)
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32) * 0.05)
    x = mx.array(rng.standard_normal((rows, k)).astype(np.float32))
    q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    return x, q, s.astype(scales), b.astype(scales)


@needs_native
@pytest.mark.parametrize("level", _levels())
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_every_level_computes_the_int8_rounded_product(level, bits, group_size):
    """Rows 1..9 (blocks of 4 and the remainders), W rows not a multiple of the tile, rows
    of whole and partial 64-byte chunks, float16 and float32 scales, 1 and 2 threads."""
    ext = _ext()
    ext.set_int8_level(level)
    try:
        seed = 0
        for n, k in ((7, 256), (33, 1024), (300, 384), (5, 192), (9, 96), (6, 32)):
            if k % group_size:
                continue
            for rows in (1, 2, 3, 4, 5, 9):
                for scales in (mx.float16, mx.float32):
                    for threads in (1, 2):
                        seed += 1
                        x, q, s, b = case(rows, n, k, bits, group_size, seed, scales)
                        ext.set_threads(threads)
                        got = np.array(NATIVE.int8_fn(x, q, s, b, group_size, bits))
                        want, magnitude = rounded_product(x, q, s, b, group_size, bits)
                        err = np.abs(got - want).max() / magnitude.max()
                        assert got.shape == (rows, n) and err < 1e-6, (n, k, rows, err)
    finally:
        ext.set_int8_level(_levels()[0])
        ext.set_threads(NATIVE.threads)


@needs_native
@pytest.mark.parametrize("bits", [4, 8])
def test_a_prefills_rows_rounded_over_the_pool_are_the_same(bits):
    """Enough rows of x that their rounding is split over the pool's threads: the same
    product, bit for bit, as on one thread, and the contract's."""
    ext = _ext()
    x, q, s, b = case(70, 48, 1024, bits, 64, seed=11)
    try:
        ext.set_threads(1)
        one = np.array(NATIVE.int8_fn(x, q, s, b, 64, bits))
        ext.set_threads(2)
        two = np.array(NATIVE.int8_fn(x, q, s, b, 64, bits))
    finally:
        ext.set_threads(NATIVE.threads)
    np.testing.assert_array_equal(one, two)
    want, magnitude = rounded_product(x, q, s, b, 64, bits)
    assert np.abs(two - want).max() / magnitude.max() < 1e-6


@needs_native
def test_rounding_x_is_all_that_differs_from_the_exact_product():
    x, q, s, b = case(2, 512, 1024, 8, 64, seed=7)
    exact = np.array(NATIVE.fn(x, q, s, b, 64, 8))
    got = np.array(NATIVE.int8_fn(x, q, s, b, 64, 8))
    rel = np.abs(got - exact).max() / np.abs(exact).max()
    # Per 32 values x moves by at most max|x| / 254: about 1% of the output here, not 0.
    assert 1e-4 < rel < 5e-2, rel
    # A block of zeros and a block of one value round exactly.
    flat = np.zeros((1, 1024), np.float32)
    flat[0, 32:64] = 0.37
    exact = np.array(NATIVE.fn(mx.array(flat), q, s, b, 64, 8))
    got = np.array(NATIVE.int8_fn(mx.array(flat), q, s, b, 64, 8))
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-6)


@needs_native
def test_a_row_with_an_infinity_or_nan_is_computed_exactly():
    x, q, s, b = case(3, 64, 256, 4, 64, seed=3)
    xs = np.array(x)
    xs[1, 17] = np.inf
    xs[2, 200] = np.nan
    got = np.array(NATIVE.int8_fn(mx.array(xs), q, s, b, 64, 4))
    exact = np.array(NATIVE.fn(mx.array(xs), q, s, b, 64, 4))
    np.testing.assert_array_equal(got[1:], exact[1:])   # inf and nan where the floats give them
    assert np.isfinite(got[0]).all() and not np.isfinite(got[1]).all()


@needs_native
def test_the_variant_falls_back_to_the_exact_kernel_where_int8_does_not_apply():
    x, q, s, b = case(1, 40, 256, 8, 64, seed=9)
    assert int8_eligible(NATIVE, x, s, 64, 8)
    half = x.astype(mx.float16)
    assert not int8_eligible(NATIVE, half, s, 64, 8)
    np.testing.assert_array_equal(
        np.array(quantized_linear_int8(half, q, s, b, None, 64, 8)),
        np.array(quantized_linear(half, q, s, b, None, 64, 8)))
    # A bias is added after the product, as the exact kernel does.
    bias = mx.arange(40, dtype=mx.float32)
    np.testing.assert_allclose(
        np.array(quantized_linear_int8(x, q, s, b, bias, 64, 8)),
        np.array(NATIVE.int8_fn(x, q, s, b, 64, 8)) + np.arange(40), rtol=1e-6)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """The trained tiny-code (hidden 192: rows of whole and partial 64-byte chunks) as q4
    (group 32) and q8 (group 64) graphs, and its float32 export: real activations."""
    from mlxgraph.exporter.builtins import TRAINED_BUILTINS

    folder = tmp_path_factory.mktemp("int8")
    model = str(TRAINED_BUILTINS["tiny-code"])
    out = {}
    for name, recipe in (("q4", QuantizeRecipe("q4", 32)), ("q8", QuantizeRecipe("q8", 64)),
                         ("float32", None)):
        out[name] = folder / f"{name}.mlxg"
        export(model, out[name], max_seq_len=64, quantize=recipe)
    return out


def _greedy(program, prompt, steps):
    session = program.session(capacity=64)
    logits = session.step(mx.array([prompt]), range(len(prompt)))
    first = np.array(logits[0, -1])
    tokens = []
    for i in range(steps):
        tokens.append(int(mx.argmax(logits[0, -1]).item()))
        logits = session.step(mx.array([[tokens[-1]]]), [len(prompt) + i])
    return first, tokens


@needs_native
@pytest.mark.parametrize("width", ["q4", "q8"])
def test_a_graph_loaded_with_int8_activations_stays_close_to_the_exact_one(graphs, width):
    exact = Program.load(graphs[width])
    int8 = Program.load(graphs[width], int8_activations=True)
    assert int8.int8_activations and not exact.int8_activations
    assert int8.fingerprint != exact.fingerprint  # its caches are not the exact one's
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 1000, 24)]
    e_logits, e_tokens = _greedy(exact, prompt, 12)
    i_logits, i_tokens = _greedy(int8, prompt, 12)
    rel = np.abs(i_logits - e_logits).max() / np.abs(e_logits).max()
    assert 0 < rel < 5e-2, rel   # it ran the int8 kernel, and close
    assert np.corrcoef(i_logits, e_logits)[0, 1] > 0.999
    assert sum(a == b for a, b in zip(i_tokens, e_tokens)) >= 9, (i_tokens, e_tokens)


@needs_native
def test_int8_activations_is_refused_where_it_would_do_nothing(graphs):
    with pytest.raises(ValueError, match="no product with a q8 or q4 weight"):
        Program.load(graphs["float32"], int8_activations=True)
    with pytest.raises(ValueError, match="True or False"):
        Program.load(graphs["q8"], int8_activations="yes")
    with pytest.raises(ValueError, match="CPU only"):
        Program.load(graphs["q8"], int8_activations=True, device_plan="gpu")


@needs_native
def test_generate_flag_and_stats(graphs, capsys):
    from mlxgraph.tools.cli import main

    code = main(["generate", str(graphs["q8"]), "--prompt-ids", "5,6,7", "--max-tokens", "3",
                 "--int8-activations", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stats"]["quantized"]["int8"] == NATIVE.int8_simd
    assert doc["stats"]["quantized"]["kernel"].startswith("int8 activations")
    code = main(["generate", str(graphs["float32"]), "--prompt-ids", "5,6", "--max-tokens", "2",
                 "--int8-activations"])
    err = capsys.readouterr().err
    assert code != 0 and "--int8-activations: " in err and "no product with a q8" in err
