"""Run in a subprocess by tests/test_blas_router.py: call the router's cblas_sgemm directly,
for every order/transpose combination, matrix-vector, few-row (2..8 rows or columns) and
general shapes, padded leading dimensions, alpha and beta values, and compare with a
float64 numpy oracle.

    python tests/router_cases.py ROUTER_SO BLAS_SO PREFIX ROUTE(0|1) THREADS [TILE(0|2)]
        [MATVEC(1|0)]

THREADS > 0 gives every product that many threads (the few-row kernel splits its columns);
0 leaves the BLAS's setting. TILE 2 sends every general product (neither matrix-vector nor
few-row) to the router's many-row kernel (native/tile_gemm.c) and adds shapes that reach
each of its paths: several k blocks, a second pass of rows, a one-vector last panel, a
column tail. MATVEC 0 sends every matrix-vector product to sgemv, 1 (the default) those
against a weight read along k to the router's one-row kernel (native/matvec_f32.c).
Prints one JSON line: cases run, worst relative error, padding
or NaN problems, and the router's call counts next to how many cases were matrix-vector
and few-row.
"""

import ctypes
import itertools
import json
import os
import sys

import numpy as np

ROW, COL = 101, 102
NO, T, CT = 111, 112, 113
# (M, N, K): matrix-vector, few-row (M or N in 2..8; N >= 64 splits over threads, with a
# column tail past the 32-column blocks), general, and empty (K == 0).
SHAPES = [
    (1, 37, 53), (29, 1, 41), (1, 1, 19), (1, 64, 1), (23, 31, 17), (2, 3, 5), (1, 5, 0),
    (2, 37, 53), (8, 70, 33), (3, 130, 19), (77, 4, 21), (5, 3, 9), (9, 40, 12), (6, 7, 0),
]
# For the many-row kernel: 45 rows = a 32-row panel and a 13-row one-vector panel; 150 rows
# = a 128-row pass and a 22-row one; K = 1100 = two k blocks; N % 12 != 0 = a column tail.
TILE_SHAPES = [(45, 38, 1100), (150, 29, 70), (33, 40, 9)]
F = ctypes.POINTER(ctypes.c_float)


def stored(rows, cols, ld, order, fill, rng):
    """A buffer holding a rows x cols matrix with leading dimension ld, padding = fill."""
    outer, inner = (rows, cols) if order == ROW else (cols, rows)
    buf = np.full(max(outer, 1) * ld, fill, dtype=np.float32)
    grid = buf[: outer * ld].reshape(outer, ld) if outer else buf[:0].reshape(0, ld)
    grid[:, :inner] = rng.standard_normal((outer, inner)).astype(np.float32)
    return buf


def matrix(buf, rows, cols, ld, order):
    """The logical rows x cols matrix (float64) of a stored buffer."""
    outer, inner = (rows, cols) if order == ROW else (cols, rows)
    grid = buf[: outer * ld].reshape(outer, ld)[:, :inner].astype(np.float64)
    return grid if order == ROW else grid.T


def one_case(sgemm, order, ta, tb, m, n, k, pad, alpha, beta, rng):
    a_rows, a_cols = (m, k) if ta == NO else (k, m)
    b_rows, b_cols = (k, n) if tb == NO else (n, k)
    lda = (a_cols if order == ROW else a_rows) + pad or 1
    ldb = (b_cols if order == ROW else b_rows) + pad or 1
    ldc = (n if order == ROW else m) + pad
    a = stored(a_rows, a_cols, lda, order, 7.0, rng)
    b = stored(b_rows, b_cols, ldb, order, 7.0, rng)
    # beta == 0 must not read C: fill it with NaN. Padding gets a sentinel that must survive.
    c = stored(m, n, ldc, order, -3.5, rng)
    c_in = matrix(c, m, n, ldc, order)
    if beta == 0.0:
        c_in = np.zeros_like(c_in)
        outer, inner = (m, n) if order == ROW else (n, m)
        c.reshape(outer, ldc)[:, :inner] = np.nan
    op_a = matrix(a, a_rows, a_cols, lda, order)
    op_b = matrix(b, b_rows, b_cols, ldb, order)
    op_a = op_a if ta == NO else op_a.T
    op_b = op_b if tb == NO else op_b.T
    want = alpha * (op_a @ op_b) + beta * c_in
    sgemm(
        order,
        ta,
        tb,
        m,
        n,
        k,
        ctypes.c_float(alpha),
        a.ctypes.data_as(F),
        lda,
        b.ctypes.data_as(F),
        ldb,
        ctypes.c_float(beta),
        c.ctypes.data_as(F),
        ldc,
    )
    got = matrix(c, m, n, ldc, order)
    outer, inner = (m, n) if order == ROW else (n, m)
    padding_ok = bool(np.all(c.reshape(outer, ldc)[:, inner:] == -3.5))
    # Relative to the sum of the magnitudes (what float32 rounding scales with), so a result
    # that cancels to near zero does not inflate the error.
    size = abs(alpha) * (np.abs(op_a) @ np.abs(op_b)) + abs(beta) * np.abs(c_in)
    scale = max(float(np.max(size)) if want.size else 0.0, 1e-6)
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    return err, padding_ok, bool(np.all(np.isfinite(got)))


def few_rows(m, n, k) -> bool:
    """The router's few-row class: 2..8 rows or columns, not matrix-vector, not empty."""
    return k > 0 and min(m, n) > 1 and (2 <= m <= 8 or 2 <= n <= 8)


def general(m, n, k) -> bool:
    """Neither matrix-vector, few-row nor empty: the BLAS's sgemm, or the many-row kernel."""
    return k > 0 and min(m, n) > 1 and not few_rows(m, n, k)


def main(router_so, blas_so, prefix, route, threads, tile=0, native_matvec=1) -> dict:
    blas = ctypes.CDLL(blas_so, mode=os.RTLD_LOCAL)
    router = ctypes.CDLL(router_so, mode=os.RTLD_LOCAL)
    router.mlxgraph_router_bind.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int)
    assert router.mlxgraph_router_bind(blas._handle, prefix.encode(), route) == 0
    router.mlxgraph_router_threads.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long)
    if threads:
        assert router.mlxgraph_router_threads(threads, threads, 0) == 0
    router.mlxgraph_router_tile.argtypes = (ctypes.c_int,)
    tiled = router.mlxgraph_router_tile(tile)
    router.mlxgraph_router_matvec.argtypes = (ctypes.c_int,)
    router.mlxgraph_router_matvec(native_matvec)
    shapes = SHAPES + (TILE_SHAPES if tile else [])
    sgemm = router.cblas_sgemm
    rng = np.random.default_rng(0)
    worst, bad_padding, nonfinite, cases, matvec, small, big = 0.0, 0, 0, 0, 0, 0, 0
    for order, ta, tb, (m, n, k), pad, (alpha, beta) in itertools.product(
        (ROW, COL), (NO, T, CT), (NO, T, CT), shapes, (0, 3), ((1.0, 0.0), (-0.5, 1.0), (2.0, 0.25))
    ):
        err, padding_ok, finite = one_case(sgemm, order, ta, tb, m, n, k, pad, alpha, beta, rng)
        worst, cases = max(worst, err), cases + 1
        bad_padding += not padding_ok
        nonfinite += not finite
        matvec += (m == 1 or n == 1) and k > 0
        small += few_rows(m, n, k)
        big += general(m, n, k)
    counts = (ctypes.c_long * 6)()
    router.mlxgraph_router_counts(counts, 6)
    return {
        "cases": cases,
        "matvec_cases": matvec,
        "small_cases": small,
        "general_cases": big,
        "tile_mode": tiled,
        "worst": worst,
        "bad_padding": bad_padding,
        "nonfinite": nonfinite,
        "sgemv_calls": counts[0],
        "small_calls": counts[1],
        "sgemm_calls": counts[2],
        "threaded_calls": counts[3],
        "tile_calls": counts[4],
        "matvec_calls": counts[5],
    }


if __name__ == "__main__":
    args = sys.argv[1:]
    tile = int(args[5]) if len(args) > 5 else 0
    native = int(args[6]) if len(args) > 6 else 1
    print(json.dumps(main(args[0], args[1], args[2], int(args[3]), int(args[4]), tile, native)))
