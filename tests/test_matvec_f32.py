"""The router's decode kernel (interpreter/native/matvec_f32.c): within a stated float32
error bound of a float64 product at decode's depths, every path of it (whole row tiles,
rows left over, a k tail, a strided x, alpha and beta, 1..8 rows of x), and the same bits
whatever the thread count (each output is summed in one order however the rows of W are
chunked).

The bound: each output sums its K products in 16 lanes of at most ceil(K / 16) fused
multiply-adds, 4 levels of a horizontal sum, then the K % 16 tail one at a time, then alpha
and beta: at most n = ceil(K / 16) + 4 + K % 16 + 2 roundings in sequence, so
|got - exact| <= n * 2^-24 * (|alpha| * sum_k |x_k w_k| + |beta c|) (first order; the test
allows 1% over it).
"""

import ctypes
import os

import numpy as np
import pytest

from mlxgraph.interpreter.native.blas import pypi_openblas_file
from mlxgraph.interpreter.native.blas_router import router_file

ROW, NO, T = 101, 111, 112
F = ctypes.POINTER(ctypes.c_float)


@pytest.fixture(scope="module")
def sgemm():
    """The router's cblas_sgemm, bound to pip's OpenBLAS, one-row kernel on."""
    path, blas_path = router_file(), pypi_openblas_file()
    if not path or not blas_path:
        pytest.skip("no BLAS router or pip OpenBLAS here (tests/test_blas_router.py says why)")
    blas = ctypes.CDLL(blas_path, mode=os.RTLD_LOCAL)
    router = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
    router.mlxgraph_router_bind.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int)
    assert router.mlxgraph_router_bind(blas._handle, b"scipy_", 1) == 0
    router.mlxgraph_router_threads.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long)
    router.mlxgraph_router_matvec(1)

    def run(x, w, alpha=1.0, beta=0.0, c=None, threads=1, x_trans=False):
        """alpha * x @ w.T + beta * c through cblas_sgemm (w's rows along k)."""
        m, k = x.shape
        n = w.shape[0]
        router.mlxgraph_router_threads(threads, threads, 0)
        a = np.ascontiguousarray(x.T if x_trans else x, dtype=np.float32)
        out = np.array(c if c is not None else np.full((m, n), np.nan), dtype=np.float32)
        router.cblas_sgemm(ROW, T if x_trans else NO, T, m, n, k, ctypes.c_float(alpha),
                           a.ctypes.data_as(F), m if x_trans else k,
                           w.ctypes.data_as(F), k, ctypes.c_float(beta),
                           out.ctypes.data_as(F), n)
        return out

    return run


def _within_bound(got, x, w, alpha, beta, c):
    k = x.shape[1]
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    exact = alpha * (x64 @ w64.T) + (beta * c.astype(np.float64) if beta else 0.0)
    size = abs(alpha) * (np.abs(x64) @ np.abs(w64).T) + (abs(beta) * np.abs(c) if beta else 0)
    steps = -(-k // 16) + 4 + k % 16 + 2
    excess = np.abs(got - exact) - 1.01 * steps * 2.0**-24 * size
    return float(excess.max())


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n,k", [(1027, 1024), (64, 2816), (37, 1000), (9, 15)])
def test_within_the_float32_bound_of_float64(sgemm, rows, n, k):
    rng = np.random.default_rng(rows * 7 + n)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    c = rng.standard_normal((rows, n)).astype(np.float32)
    for alpha, beta in ((1.0, 0.0), (-0.5, 0.25)):
        got = sgemm(x, w, alpha, beta, c if beta else None)
        assert _within_bound(got, x, w, alpha, beta, c) <= 0, (alpha, beta)


def test_a_strided_row_of_x_is_read_as_packed(sgemm):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 700)).astype(np.float32)
    w = rng.standard_normal((130, 700)).astype(np.float32)
    assert np.array_equal(sgemm(x, w, x_trans=True), sgemm(x, w))


@pytest.mark.parametrize("rows", [1, 4])
def test_bits_do_not_depend_on_the_thread_count(sgemm, rows):
    # 2000 rows of W at k 1024: 16 chunks of 128 rows, shared by 1, 2 and 3 threads.
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 1024)).astype(np.float32)
    w = rng.standard_normal((2000, 1024)).astype(np.float32)
    one = sgemm(x, w, threads=1)
    assert np.array_equal(one, sgemm(x, w, threads=2))
    assert np.array_equal(one, sgemm(x, w, threads=3))
