"""The benchmarks' engine processes run each peer as its users run it."""

import subprocess
import sys
from pathlib import Path

ENGINES = Path(__file__).resolve().parents[1] / "benchmarks" / "engines"


def test_the_engines_shared_module_does_not_import_mlxgraph():
    """``import mlxgraph`` before mlx puts mlxgraph's BLAS under MLX (its import hook), so
    the module every engine imports first must not: mlx-lm "as installed" would run on it."""
    code = (f"import sys; sys.path.insert(0, {str(ENGINES)!r}); import common; "
            "import mlx.core; print(sorted(m for m in sys.modules if m.startswith('mlxgraph')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout
