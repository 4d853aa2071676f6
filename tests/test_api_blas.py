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


def test_importing_mlx_after_mlxgraph_is_fast():
    """`import mlxgraph` then `import mlx.core as mx` (a script's header) then load(): the
    import hook preloaded before mlx, so nothing warns."""
    got = _run(_LOAD_TWICE.format(first="import mlxgraph, mlx.core", graph=GRAPH))
    assert got["warnings"] == []
    assert got["blas"]["preloaded"] or "no optimised CBLAS" in got["blas"]["detail"]


def test_the_import_hook_leaves_a_bad_knob_to_load():
    """An unrelated `import mlx` does not fail on a bad MLXGRAPH_* knob; load() says it."""
    got = _run("""
        import json, os
        os.environ["MLXGRAPH_BLAS_THREADS"] = "many"
        import mlxgraph
        import mlx.core
        try:
            mlxgraph.load(PATH)
            print(json.dumps({"error": None}))
        except mlxgraph.BlasError as e:
            print(json.dumps({"error": str(e)}))
    """.replace("PATH", repr(GRAPH)))
    assert got["error"] and got["error"].startswith("MLXGRAPH_BLAS_THREADS=many")


def test_preload_blas_is_public_and_idempotent():
    got = _run("""
        import json, mlxgraph
        a = mlxgraph.preload_blas()
        b = mlxgraph.preload_blas()
        print(json.dumps({"same": a is b, "in_use": mlxgraph.blas_in_use() is a}))
    """)
    assert got == {"same": True, "in_use": True}


_IMPORT_ONE = """
    import json, sys
    from mlxgraph import {name}
    from mlxgraph.interpreter.native import blas
    state = blas._state
    print(json.dumps({{"mlx_imported": "mlx.core" in sys.modules,
                      "attempted": state is not None,
                      "blas": state.as_dict() if state is not None else None}}))
"""


def _run_all(codes: dict) -> dict:
    """Each code in its own fresh interpreter, all at once; {key: its JSON line}."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXGRAPH_BLAS")}
    procs = {key: subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for key, code in codes.items()}
    out = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (key, stderr[-2000:])
        out[key] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_every_public_name_puts_the_fast_blas_under_mlx_first():
    """`from mlxgraph import NAME` in a fresh process: a name whose module imports mlx is
    preceded by the preload; an mlx-free one leaves both mlx and the preload alone."""
    import mlxgraph

    names = list(mlxgraph._LAZY)
    got = _run_all({n: _IMPORT_ONE.format(name=n) for n in names})
    for name in names:
        g = got[name]
        if mlxgraph._LAZY[name] in mlxgraph._MLX_FREE:
            assert not g["mlx_imported"] and not g["attempted"], (name, g)
        else:
            assert g["attempted"], (name, g)  # preloaded, or said why not (no CBLAS here)
            assert g["blas"]["preloaded"] or "no optimised CBLAS" in g["blas"]["detail"], (
                name, g)
    # the preload must have been needed somewhere: most names import mlx
    assert sum(got[n]["mlx_imported"] for n in names) >= 5


def test_the_readme_import_line_is_fast():
    got = _run("""
        import json
        from mlxgraph import load, generate, ChatSession
        import mlxgraph
        load({graph!r})
        print(json.dumps(mlxgraph.blas_in_use().as_dict()))
    """.replace("{graph!r}", repr(GRAPH)))
    assert got["preloaded"] or "no optimised CBLAS" in got["detail"]


def test_lazy_names_respect_the_blas_knobs():
    code = """
        import json, os, sys
        os.environ.update({env})
        try:
            from mlxgraph import generate
            print(json.dumps({{"blas": __import__("mlxgraph").blas_in_use().as_dict()}}))
        except Exception as e:
            print(json.dumps({{"error": type(e).__name__, "message": str(e),
                              "mlx_imported": "mlx.core" in sys.modules}}))
    """
    got = _run_all({
        "none": code.format(env={"MLXGRAPH_BLAS": "none"}),
        "bad": code.format(env={"MLXGRAPH_BLAS_THREADS": "many"}),
    })
    assert not got["none"]["blas"]["preloaded"]
    assert "MLXGRAPH_BLAS=none" in got["none"]["blas"]["detail"]
    # a bad knob is refused as load() refuses it, before mlx is imported
    assert got["bad"]["error"] == "BlasError" and "MLXGRAPH_BLAS_THREADS" in got["bad"]["message"]
    assert not got["bad"]["mlx_imported"]
