"""The CBLAS router (interpreter/native/blas_router.c): built at install, exact against a
numpy oracle for every order/transpose/leading-dimension/alpha/beta case, really on
MLX's path, and optional (an install without a C compiler succeeds; the stats say so).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from blas_helpers import has_avx512

from mlxgraph.interpreter.native.blas import pypi_openblas_file
from mlxgraph.interpreter.native.blas_router import router_file

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


def _py(code: str, env_extra=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXGRAPH_BLAS")}
    env.update(env_extra or {})
    return subprocess.run(
        [PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=180
    )


def _blas_files() -> list:
    """(library, symbol prefix) of each optimised CBLAS on this machine."""
    found = []
    if pypi_openblas_file():
        found.append((pypi_openblas_file(), "scipy_"))
    probe = _py("import ctypes; ctypes.CDLL('libopenblas.so.0'); print('ok')")
    if probe.stdout.strip() == "ok":
        found.append(("libopenblas.so.0", ""))
    return found


@pytest.fixture(scope="module")
def router():
    path = router_file()
    if not path:
        if HAS_CC:
            pytest.fail("a C compiler is present but the install did not build the BLAS router")
        pytest.skip("no C compiler: the router is not built (install still works)")
    return path


@pytest.mark.parametrize(
    "route,threads,tile,matvec",
    [(1, 0, 0, 1), (1, 2, 0, 1), (1, 0, 0, 0), (0, 0, 0, 1), (1, 2, 2, 1)],
    ids=["routing", "routing-2-threads", "routing-sgemv", "forwarding", "tile-kernel-2-threads"],
)
def test_every_case_matches_numpy(router, route, threads, tile, matvec):
    libs = _blas_files()
    if not libs:
        pytest.skip("no optimised CBLAS on this machine")
    if tile and not has_avx512():
        pytest.skip("the many-row kernel needs AVX-512 (the router keeps the BLAS's sgemm)")
    for lib, prefix in libs[:1] if tile else libs:
        args = [router, lib, prefix, str(route), str(threads), str(tile), str(matvec)]
        proc = subprocess.run(
            [PY, str(ROOT / "tests" / "router_cases.py"), *args],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout)
        assert got["cases"] == (1836 if tile else 1512) and got["worst"] < 1e-6, (lib, got)
        assert got["bad_padding"] == 0 and got["nonfinite"] == 0, (lib, got)
        # Every matrix-vector case (and only those) went to the one-row kernel (a weight
        # read along k) or sgemv when routing is on, every few-row case to the router's
        # kernel, and (tile mode 2) every general case to the many-row kernel.
        one_row = got["sgemv_calls"] + got["matvec_calls"]
        assert one_row == (got["matvec_cases"] if route else 0), (lib, got)
        assert (got["matvec_calls"] > 0) == bool(route and matvec), (lib, got)
        assert got["small_calls"] == (got["small_cases"] if route else 0), (lib, got)
        assert got["tile_mode"] == tile, (lib, got)
        assert got["tile_calls"] == (got["general_cases"] if tile else 0), (lib, got)
        assert one_row + got["small_calls"] + got["sgemm_calls"] + got["tile_calls"] == got[
            "cases"
        ]
        assert got["threaded_calls"] == (got["cases"] if threads > 1 else 0), (lib, got)


_MLX_PATH = """
from mlxgraph.interpreter.native.blas import preload_blas
from mlxgraph.interpreter.native.blas_router import router_counts
info = preload_blas()
import numpy as np, mlx.core as mx
rng = np.random.default_rng(1)
worst = 0.0
w = rng.standard_normal((96, 80)).astype(np.float32)
W = mx.array(w)
for x_np, w_np, x, wt in [
    # decode-shaped: one row against a transposed weight (x @ W.T)
    ((v := rng.standard_normal((1, 80)).astype(np.float32)), w.T, mx.array(v), W.T),
    # one column, and a strided (sliced) weight view
    (w[:, :40], (u := rng.standard_normal((40, 1)).astype(np.float32)), W[:, :40], mx.array(u)),
    # a transposed one-row operand
    ((t := rng.standard_normal((80, 1)).astype(np.float32)).T, w[:64].T, mx.array(t).T, W[:64].T),
    # batched one-row products (one weight per batch entry), and a general product
    ((z := rng.standard_normal((3, 1, 80)).astype(np.float32)),
     (y := rng.standard_normal((3, 80, 7)).astype(np.float32)), mx.array(z), mx.array(y)),
    (w[:50], w.T[:, ::2], W[:50], W.T[:, ::2]),
    # few rows (2..8) against a transposed weight, a plain one, and few columns
    ((f := rng.standard_normal((5, 80)).astype(np.float32)), w.T, mx.array(f), W.T),
    (f[:2, :40].copy(), w[:40], mx.array(f[:2, :40]), W[:40]),
    (w, f.T[:, :3].copy(), W, mx.array(f.T[:, :3])),
]:
    got = np.array(x @ wt)
    ref = x_np.astype(np.float64) @ w_np.astype(np.float64)
    worst = max(worst, float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))))
print(json.dumps({"worst": worst, **router_counts(info.router_path)}))
"""


def test_mlx_products_take_the_router(router):
    proc = _py("import json\n" + _MLX_PATH)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if got.get("sgemv", 0) + got.get("sgemm", 0) + got.get("matvec", 0) == 0:
        pytest.skip("no optimised CBLAS was preloaded")
    assert got["worst"] < 1e-5
    # decode-shaped products (a weight read along k) take the one-row kernel, the batched
    # x @ y ones (y's rows along n) sgemv
    assert got["matvec"] >= 3 and got["sgemv"] >= 3, got
    assert got["small"] >= 3 and got["sgemm"] >= 1, got


def test_matvec_off_sends_one_row_products_to_sgemv(router):
    code = "import json\n" + _MLX_PATH.replace(
        "print(json.dumps({", "print(json.dumps({'router': info.router, ")
    proc = _py(code, {"MLXGRAPH_BLAS_MATVEC": "sgemv"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["sgemm"]:
        pytest.skip("no optimised CBLAS was preloaded")
    assert "sgemv for one row (MLXGRAPH_BLAS_MATVEC=sgemv)" in got["router"], got
    assert got["worst"] < 1e-5 and got["matvec"] == 0 and got["sgemv"] >= 6, got


def test_router_off_forwards_everything_to_sgemm(router):
    proc = _py("import json\n" + _MLX_PATH, {"MLXGRAPH_BLAS_ROUTER": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["worst"] < 1e-5
    # the prefixed pip OpenBLAS still needs the library to forward; a plain one does not
    assert got.get("sgemv", 0) == 0 and got.get("small", 0) == 0 and got.get("matvec", 0) == 0


_ALPHA_ZERO = """
import json
from mlxgraph.interpreter.native.blas import preload_blas
info = preload_blas()
import numpy as np, mlx.core as mx
seen = {}
for m in (1, 4, 40, 400):   # sgemv, few-row kernel, many-row kernel, sgemm
    a, b = mx.full((m, 600), float("inf")), mx.ones((600, 1100))
    for beta in (2.0, 0.0):
        got = np.array(mx.addmm(mx.ones((m, 1100)), a, b, alpha=0.0, beta=beta))
        seen[f"{m}:{beta}"] = [float(v) for v in np.unique(got)]
print(json.dumps({"preloaded": info.preloaded, "seen": seen}))
"""


@pytest.mark.parametrize("tile", ["on", "always"])
def test_alpha_zero_never_reads_the_operands(router, tile):
    """The BLAS contract: alpha == 0 gives beta * C without reading A or B (MLX's own BLAS
    does so; Inf in A must not turn C into NaN on any of the router's paths)."""
    proc = _py(_ALPHA_ZERO, {"MLXGRAPH_BLAS_TILE": tile})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["preloaded"]:
        pytest.skip("no optimised CBLAS was preloaded")
    want = {f"{m}:{beta}": [beta] for m in (1, 4, 40, 400) for beta in (2.0, 0.0)}
    assert got["seen"] == want, got


def test_without_router_stats_say_absent():
    code = """
        import json
        import mlxgraph.interpreter.native.blas as b
        b.router_file = lambda: ""
        print(json.dumps(b.preload_blas().as_dict()))
    """
    info = json.loads(_py(code).stdout.strip().splitlines()[-1])
    if info["preloaded"]:
        # a plain CBLAS (the system's) is still usable, made global itself
        assert info["router"].startswith("absent") and "scipy_openblas" not in info["path"]
    else:
        assert info["router"] == ""


def test_prefixed_blas_without_router_is_refused_by_name():
    if not pypi_openblas_file():
        pytest.skip("scipy-openblas32 not installed")
    code = """
        import mlxgraph.interpreter.native.blas as b
        b.router_file = lambda: ""
        try:
            b.preload_blas()
        except b.BlasError as e:
            print(e)
    """
    out = _py(code, {"MLXGRAPH_BLAS": "scipy-openblas32"}).stdout
    assert "prefix 'scipy_'" in out and "router was not built" in out


def test_build_without_a_compiler_still_succeeds(tmp_path):
    # setup.py marks the router optional: a failing compiler must not fail the install.
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"))
    proc = subprocess.run(
        [
            PY,
            "setup.py",
            "-q",
            "build_ext",
            "-b",
            str(tmp_path / "lib"),
            "-t",
            str(tmp_path / "tmp"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not list((tmp_path / "lib").rglob("_blas_router*"))
    assert "blas_router" in proc.stdout + proc.stderr  # setuptools says which extension it skipped


_THREADS_CODE = """
    import ctypes, json
    import mlxgraph
    info = mlxgraph.preload_blas()
    import mlx.core as mx
    from mlxgraph.interpreter.native.blas_router import cblas_prefix, router_counts
    lib = ctypes.CDLL(info.path)
    get = getattr(lib, cblas_prefix(lib) + "openblas_get_num_threads")
    seen = []
    # (rows, K, N): matrix-vector and general products below and above 4096 multiply-adds,
    # then few-row ones (their own kernel: only the counter shows their threads)
    for m, k, n in [(1, 48, 64), (1, 96, 64), (16, 8, 16), (16, 32, 16), (4, 8, 64), (4, 32, 64)]:
        w = mx.random.normal((n, k))
        x = mx.random.normal((m, k))
        mx.eval(w, x)
        mx.eval(x @ w.T)
        seen.append(get())
    print(json.dumps({"router": info.router, "seen": seen, **router_counts(info.router_path)}))
"""


def _threads_run(setting, extra=None):
    env = {"MLXGRAPH_BLAS_THREADS": setting} if setting else {}
    proc = _py(_THREADS_CODE, {**env, **(extra or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_threads_follow_product_size(router):
    # 2 threads from 4096 multiply-adds, 1 below: the router's count of calls it gave more
    # than one thread. It threads them itself (chunks, each a one-thread BLAS call), so
    # the BLAS's own count stays 1.
    got = _threads_run("2:4096")
    assert "threads 2 from 4096 multiply-adds, 1 below" in got["router"], got
    assert got["threaded"] == 3, got  # 1x96x64, 16x32x16, 4x32x64
    assert got["small"] == 2 and got["seen"] == [1] * 6, got


def test_fixed_thread_count_applies_to_every_product(router):
    one, two = _threads_run("1"), _threads_run("2")
    assert one["threaded"] == 0 and two["threaded"] == 6, (one, two)
    assert "threads 2 (MLXGRAPH_BLAS_THREADS=2)" in two["router"]


def test_default_policy_is_size_aware(router):
    got = _threads_run(None)
    assert "(auto)" in got["router"] and "from 1M multiply-adds, 1 below" in got["router"]
    assert got["threaded"] == 0, got  # every product here is below 1M multiply-adds


def test_openblas_num_threads_leaves_the_blas_alone(router):
    got = _threads_run(None, {"OPENBLAS_NUM_THREADS": "2"})
    assert "threads" not in got["router"] and got["threaded"] == 0, got
    assert got["seen"] == [2] * 6, got


def test_bad_thread_setting_is_an_error():
    proc = _py(
        """
        import mlxgraph
        try:
            mlxgraph.preload_blas()
        except mlxgraph.BlasError as e:
            print(e)
    """,
        {"MLXGRAPH_BLAS_THREADS": "two"},
    )
    assert "MLXGRAPH_BLAS_THREADS=two" in proc.stdout
    assert "expected auto, N or N:MIN_WORK" in proc.stdout

