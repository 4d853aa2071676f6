"""The router's many-row kernel (interpreter/native/tile_gemm.c) on MLX's path: taken where
it is faster, switched off or forced by MLXGRAPH_BLAS_TILE, exact against numpy, and a real
graph's steps on it against the dense float64 oracle. (tests/router_cases.py checks every
order/transpose/stride/alpha/beta case of it directly: tests/test_blas_router.py.)
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

from mlxgraph.interpreter.native.blas_router import router_file

ROOT = Path(__file__).resolve().parent.parent


def _py(code: str, env_extra=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXGRAPH_BLAS")}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
        timeout=180,
    )


@pytest.fixture(scope="module")
def router():
    if not router_file():
        pytest.skip("the BLAS router is not built (tests/test_blas_router.py says why)")


_TILE_PATH = """
import json
import shutil
from mlxgraph.interpreter.native.blas import preload_blas
from mlxgraph.interpreter.native.blas_router import router_counts
info = preload_blas()
import numpy as np, mlx.core as mx
rng = np.random.default_rng(3)
worst = 0.0
# A 40-token prefill against a 1100 x 600 weight (x @ W.T), the same as x @ W, and a
# 200-row product (more rows than the kernel takes by default).
w = rng.standard_normal((1100, 600)).astype(np.float32)
x = rng.standard_normal((40, 600)).astype(np.float32)
big = rng.standard_normal((200, 600)).astype(np.float32)
for x_np, w_np, got in [(x, w.T, mx.array(x) @ mx.array(w).T),
                        (x, w.T.copy(), mx.array(x) @ mx.array(w.T.copy())),
                        (big, w.T, mx.array(big) @ mx.array(w).T)]:
    ref = x_np.astype(np.float64) @ w_np.astype(np.float64)
    worst = max(worst, float(np.max(np.abs(np.array(got) - ref)) / np.max(np.abs(ref))))
print(json.dumps({"worst": worst, "router": info.router, **router_counts(info.router_path)}))
"""


def _tile_run(setting=None):
    proc = _py(_TILE_PATH, {"MLXGRAPH_BLAS_TILE": setting} if setting is not None else {})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if got["sgemm"] + got["tile"] == 0:
        pytest.skip("no optimised CBLAS was preloaded")
    return got


def test_many_row_products_take_the_tile_kernel_where_it_is_faster(router):
    got = _tile_run()
    assert got["worst"] < 1e-5, got
    if not has_avx512():
        assert got["tile"] == 0 and "needs AVX-512" in got["router"], got
        return
    # the 40-row x @ W.T takes the kernel; x @ W (W's rows along n) and the 200-row product
    # stay with the BLAS
    assert got["tile"] == 1 and got["sgemm"] >= 2, got
    assert "tile kernel for 9..160 rows" in got["router"], got


def test_tile_kernel_can_be_switched_off_or_forced(router):
    off = _tile_run("0")
    assert off["tile"] == 0 and off["worst"] < 1e-5, off
    assert "sgemm for many rows (MLXGRAPH_BLAS_TILE=0)" in off["router"], off
    if has_avx512():
        always = _tile_run("always")
        assert always["tile"] == 3 and always["worst"] < 1e-5, always
    bad = _py("from mlxgraph.interpreter.native.blas import preload_blas; preload_blas()",
              {"MLXGRAPH_BLAS_TILE": "fast"})
    assert bad.returncode != 0 and "MLXGRAPH_BLAS_TILE=fast" in bad.stderr, bad.stderr[-500:]


_TINY_ORACLE = """
import json, sys
sys.path.insert(0, {tests!r})
from mlxgraph.interpreter.native.blas import preload_blas
from mlxgraph.interpreter.native.blas_router import router_counts
info = preload_blas()
import numpy as np, mlx.core as mx
import mlxgraph
from tiny_graph import TinyOracle, build_tiny_graph
wts = build_tiny_graph({path!r})
program = mlxgraph.load({path!r})
session, oracle = program.session(), TinyOracle(wts)
rng = np.random.default_rng(5)
worst = 0.0
for t in (20, 1, 1, 13, 1, 9, 1, 1):   # prefill chunks of 9+ rows (the kernel), then decode
    toks = rng.integers(0, 32, size=t).astype(np.int32)
    pos = range(session.length, session.length + t)
    got = np.array(session.step(mx.array(toks[None]), pos)).reshape(t, -1)
    want = oracle.step(toks)
    worst = max(worst, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
print(json.dumps({{"worst": worst, **router_counts(info.router_path)}}))
"""


def test_graph_steps_on_the_tile_kernel_match_the_dense_oracle(router, tmp_path):
    """Every general product of a real graph (projections, attention) on the kernel, over
    prefill chunks and decode steps, against the float64 oracle."""
    if not has_avx512():
        pytest.skip("the many-row kernel needs AVX-512")
    code = _TINY_ORACLE.format(tests=str(ROOT / "tests"), path=str(tmp_path / "tiny.mlxg"))
    proc = _py(code, {"MLXGRAPH_BLAS_TILE": "always"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["tile"] >= 8 and got["worst"] < 2e-4, got


_NO_AVX512_DRIVER = r"""
#include <stdio.h>
#include "tile_gemm.h"
int mlxgraph_router_tile(int mode);
int main(void) {
    float x[9 * 4] = {1}, w[12 * 4] = {1}, out[9 * 12];
    for (int i = 0; i < 9 * 12; i++) out[i] = -3.5f;
    int got = tile_gemm(9, 12, 4, 1.0f, x, 4, 1, w, 4, 1, 0.0f, out, 12, 1, 2);
    int untouched = 1;
    for (int i = 0; i < 9 * 12; i++) untouched &= out[i] == -3.5f;
    printf("%d %d %d %d\n", tile_gemm_available() != 0, mlxgraph_router_tile(2), got, untouched);
    return 0;
}
"""


def test_a_cpu_without_avx512_keeps_the_blas(tmp_path):
    """Under valgrind (whose x86-64 CPU has no AVX-512) the kernel says it cannot run, the
    router keeps the BLAS for every mode and a call refuses without writing C; natively it
    runs exactly when the CPU has AVX-512 (blas_helpers.has_avx512)."""
    cc, valgrind = shutil.which("cc") or shutil.which("gcc"), shutil.which("valgrind")
    if not cc or not valgrind:
        pytest.skip("needs a C compiler and valgrind")
    native = ROOT / "interpreter" / "native"
    (tmp_path / "driver.c").write_text(_NO_AVX512_DRIVER)
    exe = tmp_path / "driver"
    sources = [native / f for f in ("blas_router.c", "matvec_f32.c", "small_gemm.c",
                                    "tile_gemm.c", "pool.c")]
    subprocess.run([cc, "-O0", "-pthread", "-Wno-psabi", f"-I{native}", tmp_path / "driver.c",
                    *sources, "-ldl", "-o", exe], check=True, capture_output=True, timeout=120)
    on = "1 2 0 0" if has_avx512() else "0 0 -1 1"
    assert subprocess.run([exe], capture_output=True, text=True).stdout.split() == on.split()
    emulated = subprocess.run([valgrind, "-q", exe], capture_output=True, text=True, timeout=120)
    assert emulated.stdout.split() == ["0", "0", "-1", "1"], emulated.stderr[-1000:]
