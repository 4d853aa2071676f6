"""The BLAS preload (interpreter/native/blas.py): choice, env var, graceful fallbacks, and proof
that MLX's matrix products really bind to the preloaded library and stay correct.

Every check runs in a fresh subprocess: a preload is global to the process and only
counts before mlx is first imported. The oracle for "MLX uses it" is the dynamic
linker's own account (LD_DEBUG=bindings) of where libmlx's cblas_sgemm was bound.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

PY = sys.executable


def _py(code: str, env_extra=None, drop=("MLXGRAPH_BLAS",)) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra or {})
    return subprocess.run(
        [PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


_REPORT = """
import json, sys
{first}
import mlxgraph.interpreter.native.blas as b
{setup}
try:
    info = b.preload_blas()
    print(json.dumps(info.as_dict()))
except b.BlasError as e:
    print(json.dumps({{"error": str(e)}}))
"""


def _report(setup: str = "", env=None, first: str = "") -> dict:
    proc = _py(_REPORT.format(setup=setup, first=first), env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def optimised():
    """The optimised CBLAS the automatic search finds on this machine (skip if none)."""
    info = _report()
    if not info.get("preloaded"):
        pytest.skip("no optimised CBLAS on this machine (apt-get install libopenblas0-pthread)")
    return info


def test_nothing_found_falls_back_to_bundled():
    info = _report("b.CANDIDATES = ('libmlxgraph-no-such-blas.so.0',)")
    assert not info["preloaded"]
    assert info["name"] == "bundled reference BLAS"
    assert "scipy-openblas32" in info["detail"] and "libopenblas0-pthread" in info["detail"]


def test_default_is_the_package_index_openblas():
    # scipy-openblas32 is a dependency on Linux x86-64/aarch64: no root needed for the fast path.
    info = _report()
    if not info["preloaded"] or "scipy_openblas" not in info["path"]:
        pytest.skip("scipy-openblas32 not installed on this platform")
    assert info["name"].startswith("OpenBLAS")


def test_env_none_keeps_bundled():
    info = _report(env={"MLXGRAPH_BLAS": "none"})
    assert not info["preloaded"] and "MLXGRAPH_BLAS=none" in info["detail"]


def test_env_unloadable_path_is_an_error():
    info = _report(env={"MLXGRAPH_BLAS": "/no/such/libopenblas.so"})
    assert "/no/such/libopenblas.so" in info["error"] and "cannot be loaded" in info["error"]


def test_env_library_without_cblas_is_an_error():
    info = _report(env={"MLXGRAPH_BLAS": "libm.so.6"})
    assert "no cblas_sgemm" in info["error"]


def test_env_path_is_honoured(optimised):
    info = _report("b.CANDIDATES = ()", env={"MLXGRAPH_BLAS": optimised["path"]})
    assert info["preloaded"] and info["path"] == optimised["path"]


def test_too_late_after_mlx_import():
    # mlx before mlxgraph: after it, mlxgraph's import hook would preload first
    info = _report(first="import mlx.core")
    assert not info["preloaded"] and "mlx was imported" in info["detail"]


def test_refuses_next_to_torch():
    # The guard looks at sys.modules; a stand-in module keeps this test free of torch's import time.
    info = _report("import types; sys.modules['torch'] = types.ModuleType('torch')")
    assert not info["preloaded"] and "torch" in info["detail"]


_MATMUL = """
from mlxgraph.interpreter.native.blas import preload_blas
info = preload_blas()
import numpy as np, mlx.core as mx
rng = np.random.default_rng(0)
worst = 0.0
for (b, m, k, n, ta, tb) in [(1, 1, 257, 129, False, False), (1, 67, 129, 33, True, False),
                            (3, 17, 64, 65, False, True), (1, 256, 300, 200, True, True)]:
    a = rng.standard_normal((b, k, m) if ta else (b, m, k)).astype(np.float32)
    w = rng.standard_normal((b, n, k) if tb else (b, k, n)).astype(np.float32)
    A, W = mx.array(a), mx.array(w)
    A = A.transpose(0, 2, 1) if ta else A
    W = W.transpose(0, 2, 1) if tb else W
    got = np.array(A @ W)
    a64 = (a.transpose(0, 2, 1) if ta else a).astype(np.float64)
    ref = a64 @ (w.transpose(0, 2, 1) if tb else w).astype(np.float64)
    worst = max(worst, float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))))
print("WORST", worst, info.path)
"""


def _bound_library(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "libmlx.so" in ln and "`cblas_sgemm'" in ln]
    assert lines, "the linker never bound libmlx's cblas_sgemm"
    return lines[-1].split(" to ", 1)[1].split(" [", 1)[0]


def test_mlx_binds_to_preloaded_blas_and_stays_correct(optimised):
    proc = _py(_MATMUL, {"LD_DEBUG": "bindings"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    worst = float(proc.stdout.split("WORST", 1)[1].split()[0])
    assert worst < 1e-5
    bound = os.path.realpath(_bound_library(proc.stderr))
    # With the router built, libmlx binds to it (it forwards to the BLAS); else to the BLAS.
    assert bound == (optimised["router_path"] or optimised["path"])


def test_without_preload_mlx_binds_to_bundled():
    # The same oracle must tell the two apart, or the test above proves nothing.
    proc = _py(_MATMUL, {"LD_DEBUG": "bindings", "MLXGRAPH_BLAS": "none"}, drop=())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.split("WORST", 1)[1].split()[0]) < 1e-5
    assert "mlx_cpu.libs" in _bound_library(proc.stderr)


def test_cli_parser_imports_neither_mlx_nor_torch():
    # The CLI imports every subcommand module to build its parser; the preload in
    # `generate` only works if none of them imports mlx (or torch) at module level.
    proc = _py("""
        import sys
        from mlxgraph.tools.cli import build_parser
        build_parser()
        print(sorted(m for m in ("mlx.core", "torch") if m in sys.modules))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow
def test_preloaded_matmul_is_faster(optimised):
    code = """
        from mlxgraph.interpreter.native.blas import preload_blas
        preload_blas()
        import time, mlx.core as mx
        a = mx.random.normal((1024, 1024)); mx.eval(a, a @ a)
        t = time.perf_counter()
        for _ in range(3):
            mx.eval(a @ a)
        print((time.perf_counter() - t) / 3)
    """
    fast = float(_py(code).stdout)
    slow = float(_py(code, {"MLXGRAPH_BLAS": "none"}, drop=()).stdout)
    assert slow / fast > 3, (slow, fast)
