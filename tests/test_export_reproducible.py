"""Export files are reproducible: the same model exported in two runs gives the same bytes."""

import os
import subprocess
import sys

from conftest import TORCH_CHILD_ENV


def test_cli_exports_are_reproducible_across_runs(tmp_path):
    """tiny-gemma3 computes its per-layer-type RoPE in `set` order (transformers' code), which
    follows the string hash seed; `mlxgraph export` pins the seed, so a run without one
    writes the same file as a run with PYTHONHASHSEED=0."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    files = []
    for name, extra in (("unset", {}), ("zero", {"PYTHONHASHSEED": "0"})):
        out = tmp_path / f"{name}.mlxg"
        subprocess.run([sys.executable, "-m", "mlxgraph", "export", "tiny-gemma3", "-o", str(out),
                        "--max-seq-len", "16"], check=True, capture_output=True,
                       env={**env, **extra, **TORCH_CHILD_ENV}, timeout=300)
        files.append(out.read_bytes())
    assert files[0] == files[1]
