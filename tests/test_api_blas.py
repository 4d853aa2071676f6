"""The Python API puts a fast BLAS under MLX: ``mlxgraph.load()`` preloads when mlx is not
imported yet and warns once (naming the slowdown and the fix) when it is too late.

Each check runs in a fresh interpreter: a preload is global to its process.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

GRAPH = str(Path(__file__).resolve().parent / "golden" / "format-1.0.mlxg")


def _run(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXGRAPH_BLAS")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_LOAD_TWICE = """
    import json, sys, warnings
    {first}
    import mlxgraph
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mlxgraph.load({graph!r})
        mlxgraph.load({graph!r})
    info = mlxgraph.blas_in_use()
    print(json.dumps({{"blas": info.as_dict(), "mlx_imported": "mlx.core" in sys.modules,
                      "warnings": [(w.category.__name__, str(w.message)) for w in caught]}}))
"""


def test_load_preloads_before_mlx():
    got = _run(_LOAD_TWICE.format(first="", graph=GRAPH))
    assert got["mlx_imported"]
    assert got["warnings"] == []
    # preloaded unless this machine has no optimised CBLAS at all (then the detail says why)
    assert got["blas"]["preloaded"] or "no optimised CBLAS" in got["blas"]["detail"]


def test_load_after_mlx_warns_once_with_the_fix():
    got = _run(_LOAD_TWICE.format(first="import mlx.core", graph=GRAPH))
    assert not got["blas"]["preloaded"]
    assert len(got["warnings"]) == 1, got["warnings"]
    category, message = got["warnings"][0]
    assert category == "BlasPreloadWarning"
    assert "slower" in message and "mlxgraph.preload_blas()" in message


def test_preload_blas_is_public_and_idempotent():
    got = _run("""
        import json, mlxgraph
        a = mlxgraph.preload_blas()
        b = mlxgraph.preload_blas()
        print(json.dumps({"same": a is b, "in_use": mlxgraph.blas_in_use() is a}))
    """)
    assert got == {"same": True, "in_use": True}
