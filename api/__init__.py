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
    "TokenizerError": "mlxgraph.interpreter.tokenizer",
    # Text in, text out (import mlx on first use).
    "generate": "mlxgraph.tools.text_generation",
    "stream_generate": "mlxgraph.tools.text_generation",
    "GenerationResult": "mlxgraph.tools.text_generation",
    "ChatSession": "mlxgraph.tools.chat_session",
}


def load(path, element_limit=None):
    """Load and verify a graph file; return an immutable :class:`Program`.

    Args:
        path: the ``.mlxg`` file.
        element_limit: the most elements one tensor of a step may have (None: the file's
            default, a few times its constants plus its KV cache at max context).
    Raises:
        mlxgraph.GraphFormatError: the file is not a valid graph file, could cost more than
            the limit per step, or uses an op this version cannot run.
    """
    from mlxgraph.interpreter.program import Program

    return Program.load(path, element_limit=element_limit)


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mlxgraph' has no attribute {name!r}")


__all__ = ["load", "__version__", *_LAZY]
