"""Shared by the tools' tests: the command line run in-process, and real exported graphs."""

from mlxgraph.tools.cli import main


def run_cli(capsys, *argv):
    """Run ``mlxgraph ARGV`` in this process; returns (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def exported_tiny_llama(tmp_path_factory, dtypes=("float32", "float16")) -> dict:
    """{dtype: path}: the built-in tiny-llama exported in each of ``dtypes``.

    Exported once per test run (several test modules use it, on any xdist worker), into the
    run's shared temporary folder; callers must not modify the files.
    """
    from run_cache import build_once

    def build(dtype):
        from mlxgraph.exporter import export

        return lambda path: export("tiny-llama", str(path), dtype=dtype)

    return {
        dtype: build_once(tmp_path_factory, f"tiny-llama-{dtype}.mlxg", build(dtype))
        for dtype in dtypes
    }


def synthetic_graph(path, eos=(255,), tokenizer="byte", vocab=256, files=None, **shape):
    """A small synthetic Llama graph (seeded random weights) with the given metadata;
    ``shape``: more of synthetic_graphs.llama's arguments (heads, kv_heads...)."""
    from synthetic_graphs import llama

    spec = llama(vocab=vocab, hidden=64, intermediate=128, seed=0, tied=False, max_context=256,
                 **shape)
    spec.metadata.eos_token_ids = tuple(eos)
    spec.metadata.tokenizer = str(tokenizer)
    spec.metadata.tokenizer_files = dict(files or {})
    spec.write(path)
    return path


def generate_cli(*args, env=None):
    """`python -m mlxgraph.tools generate ARGS` in a fresh process (the BLAS preload needs one)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mlxgraph.tools", "generate", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
