"""mlxgraph: PyTorch language models as portable graph files, run on MLX.

The public entry point is :func:`load`; docs/architecture.md#python-api describes the
API. Importing this package imports neither mlx nor torch (so a fast BLAS can still be
preloaded first); the error types below are resolved on first use.
"""

__version__ = "0.1.0"

# name -> module that defines it, imported on first access (PEP 562).
_LAZY = {
    "GraphFormatError": "mlxgraph.schema.errors",
    "SessionError": "mlxgraph.interpreter.errors",
    "GraphRuntimeError": "mlxgraph.interpreter.errors",
    "CacheError": "mlxgraph.interpreter.kv_cache",
    "CacheFileError": "mlxgraph.interpreter.errors",
    "Program": "mlxgraph.interpreter.program",
    "Session": "mlxgraph.interpreter.session",
}


def load(path):
    """Load and verify a graph file; return an immutable :class:`Program`.

    Args:
        path: the ``.mlxg`` file.
    Raises:
        mlxgraph.GraphFormatError: the file is not a valid graph file, or uses an op this
            version cannot run.
    """
    from mlxgraph.interpreter.program import Program

    return Program.load(path)


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mlxgraph' has no attribute {name!r}")


__all__ = ["load", "__version__", *_LAZY]
