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

from mlxgraph.interpreter.blas import pypi_openblas_file
from mlxgraph.interpreter.blas_router import router_file

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


@pytest.mark.parametrize("route", [1, 0], ids=["routing", "forwarding"])
def test_every_case_matches_numpy(router, route):
    libs = _blas_files()
    if not libs:
        pytest.skip("no optimised CBLAS on this machine")
    for lib, prefix in libs:
        proc = subprocess.run(
            [PY, str(ROOT / "tests" / "router_cases.py"), router, lib, prefix, str(route)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout)
        assert got["cases"] == 756 and got["worst"] < 1e-5, (lib, got)
        assert got["bad_padding"] == 0 and got["nonfinite"] == 0, (lib, got)
        # Every matrix-vector case (and only those) went to sgemv when routing is on.
        assert got["sgemv_calls"] == (got["matvec_cases"] if route else 0), (lib, got)
        assert got["sgemv_calls"] + got["sgemm_calls"] == got["cases"]


_MLX_PATH = """
from mlxgraph.interpreter.blas import preload_blas
from mlxgraph.interpreter.blas_router import router_counts
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
    if got.get("sgemv", 0) + got.get("sgemm", 0) == 0:
        pytest.skip("no optimised CBLAS was preloaded")
    assert got["worst"] < 1e-5
    assert got["sgemv"] >= 5 and got["sgemm"] >= 1, got


def test_router_off_forwards_everything_to_sgemm(router):
    proc = _py("import json\n" + _MLX_PATH, {"MLXGRAPH_BLAS_ROUTER": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["worst"] < 1e-5
    # the prefixed pip OpenBLAS still needs the library to forward; a plain one does not
    assert got.get("sgemv", 0) == 0


def test_without_router_stats_say_absent():
    code = """
        import json
        import mlxgraph.interpreter.blas as b
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
        import mlxgraph.interpreter.blas as b
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


def test_threads_per_shape_class(router):
    # The router switches the BLAS's thread count per product class; read it back from the BLAS.
    code = """
        import ctypes, json
        import mlxgraph
        info = mlxgraph.preload_blas()
        import mlx.core as mx
        from mlxgraph.interpreter.blas_router import cblas_prefix
        lib = ctypes.CDLL(info.path)
        get = getattr(lib, cblas_prefix(lib) + "openblas_get_num_threads")
        w = mx.random.normal((64, 48))
        mx.eval(mx.random.normal((1, 48)) @ w.T)
        after_matvec = get()
        mx.eval(mx.random.normal((8, 48)) @ w.T)
        print(json.dumps({"router": info.router, "matvec": after_matvec, "matmul": get()}))
    """
    proc = _py(code, {"MLXGRAPH_BLAS_THREADS": "1,2"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "threads" not in got["router"]:
        pytest.skip("this BLAS cannot set its thread count")
    assert "threads 1 matrix-vector / 2 other" in got["router"]
    assert (got["matvec"], got["matmul"]) == (1, 2)


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
