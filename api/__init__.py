"""mlxgraph: PyTorch language models as portable graph files, run on MLX.

The public entry point is :func:`load`; docs/architecture.md#python-api describes the
API. Importing this package imports neither mlx nor torch, so :func:`load` (or
:func:`preload_blas`) can still put an optimised BLAS under MLX first. The other names are
resolved on first use, and a name whose module imports mlx first puts that BLAS under it
(when mlx is not imported yet), so ``from mlxgraph import load, generate`` is as fast as
``import mlxgraph``; so does the first ``import mlx`` anywhere after ``import mlxgraph``
(an import hook), so ``import mlxgraph`` then ``import mlx.core as mx`` is fast too.
"""

# Underscored: dir(mlxgraph) lists the public names only.
from os import PathLike as _PathLike
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:  # for the annotations only: importing Program imports mlx
    from mlxgraph.interpreter.program import Program

__version__ = "0.1.0"

# name -> module that defines it, imported on first access (PEP 562).
_LAZY = {
    # Every error mlxgraph raises on purpose is an mlxgraph.Error.
    "Error": "mlxgraph.schema.errors",
    "GraphFormatError": "mlxgraph.schema.errors",
    "SessionError": "mlxgraph.interpreter.errors",
    "GraphRuntimeError": "mlxgraph.interpreter.errors",
    "CacheError": "mlxgraph.interpreter.cache.kv_cache",
    "CacheFileError": "mlxgraph.interpreter.errors",
    "PipelineError": "mlxgraph.interpreter.errors",
    "Program": "mlxgraph.interpreter.program",
    "Session": "mlxgraph.interpreter.session.session",
    "BlasError": "mlxgraph.interpreter.native.blas",
    "BlasInfo": "mlxgraph.interpreter.native.blas",
    "BlasPreloadWarning": "mlxgraph.interpreter.native.blas",
    "KnobError": "mlxgraph.interpreter.knobs",
    "blas_in_use": "mlxgraph.interpreter.native.blas",
    "preload_blas": "mlxgraph.interpreter.native.blas",
    "TokenizerError": "mlxgraph.interpreter.text.tokenizer",
    "OptionError": "mlxgraph.generation.options",
    # Text in, text out (import mlx on first use).
    "generate": "mlxgraph.generation.text",
    "stream_generate": "mlxgraph.generation.text",
    "GenerationResult": "mlxgraph.generation.text",
    "batch_generate": "mlxgraph.generation.batch",
    "ChatSession": "mlxgraph.generation.chat_session",
    "ChatBusyError": "mlxgraph.generation.chat_session",
}
# The modules above that import neither mlx nor anything that does: no preload before them
# (so ``from mlxgraph import preload_blas`` leaves the preload, and its env, to the caller).
_MLX_FREE = frozenset({
    "mlxgraph.schema.errors",
    "mlxgraph.interpreter.errors",
    "mlxgraph.interpreter.knobs",
    "mlxgraph.interpreter.native.blas",
    "mlxgraph.generation.options",
})


def load(
    path: str | _PathLike,
    element_limit: int | None = None,
    compute_dtype: str | None = None,
    pipeline: _Any = None,
    pipeline_timeout: float | None = None,
    int8_activations: bool = False,
) -> "Program":
    """Load and verify a graph file; return an immutable :class:`Program`.

    First puts an optimised BLAS under MLX (:func:`preload_blas`) when MLX is not imported
    yet; when it already is, warns once (:class:`BlasPreloadWarning`) that matrix
    products run on MLX's slow bundled BLAS.

    Args:
        path: the ``.mlxg`` file.
        element_limit: the most elements one tensor of a step may have (None: the file's
            default, a few times its constants plus its KV cache at max context).
        compute_dtype: ``"float32"`` widens a float16/bfloat16 graph at load (weights and
            every half-precision tensor), since MLX's half-precision matmuls on CPU are
            20-50x slower than float32; ``None`` (default) runs the graph as stored.
        pipeline: ``True`` under ``mlx.launch`` (or an ``mx.distributed.Group``): load only
            this rank's stage of a pipeline by layer ranges (docs/pipeline.md).
        pipeline_timeout: seconds one rank waits for another before ending the run (300).
        int8_activations: ``True`` rounds x to int8 per 32 values in the products of a q8/q4
            graph, as llama.cpp does (faster on CPUs with AVX-512 VNNI; its loss is measured
            in docs/precision.md); ``False`` (default) computes them exactly.
    Raises:
        mlxgraph.GraphFormatError: the file is not a valid graph file, could cost more than
            the limit per step, or uses an op this version cannot run.
        mlxgraph.BlasError: ``MLXGRAPH_BLAS`` names a library that cannot be used, or an
            ``MLXGRAPH_BLAS*`` knob holds a value it does not take.
        mlxgraph.KnobError: another ``MLXGRAPH_*`` knob holds a value it does not take
            (docs/knobs.md).
        mlxgraph.PipelineError: the pipeline's ranks cannot connect.
        ValueError: an unsupported ``compute_dtype``, ``pipeline`` or timeout, or
            ``int8_activations`` where it cannot apply (a graph without q8/q4 weights, the
            GPU, no native kernel).
    """
    from mlxgraph.interpreter.native.blas import ensure_preloaded

    ensure_preloaded()
    from mlxgraph.interpreter.program import Program

    return Program.load(path, element_limit=element_limit, compute_dtype=compute_dtype,
                        pipeline=pipeline, pipeline_timeout=pipeline_timeout,
                        int8_activations=int8_activations)


def _preload_before_mlx() -> None:
    """Put the optimised BLAS under MLX before a module that imports mlx is imported: once
    mlx is, it is too late (load() would warn). Quiet: nothing is said when mlx or torch is
    already there (load() says it); a bad MLXGRAPH_* knob raises here as in load()."""
    import sys

    if "mlx.core" not in sys.modules:
        from mlxgraph.interpreter.native.blas import preload_blas

        preload_blas()


class _BlasBeforeMlx:
    """A one-shot import hook (on sys.meta_path from ``import mlxgraph`` on): the first
    ``import mlx`` after it puts the optimised BLAS under MLX first, as load() would have,
    so a script's ``import mlxgraph`` then ``import mlx.core as mx`` is not the 9-13x slower
    process. It finds nothing itself (the usual finders import mlx). A bad MLXGRAPH_* knob
    is left to load() to raise: an unrelated ``import mlx`` (mlx-lm's) must not fail."""

    armed = True

    @classmethod
    def find_spec(cls, name: str, path: _Any = None, target: _Any = None) -> None:
        if name == "mlx" and cls.armed:
            cls.armed = False  # first: the preload itself may look for mlx's files
            from mlxgraph.schema.errors import Error

            try:
                _preload_before_mlx()
            except Error:
                pass
        return None


def _arm_blas_hook() -> None:
    import sys

    if "mlx" not in sys.modules and _BlasBeforeMlx not in sys.meta_path:
        sys.meta_path.insert(0, _BlasBeforeMlx)  # before the path finder that finds mlx


_arm_blas_hook()


def __getattr__(name: str) -> _Any:
    if name in _LAZY:
        from importlib import import_module

        if _LAZY[name] not in _MLX_FREE:
            _preload_before_mlx()
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mlxgraph' has no attribute {name!r}")


def __dir__() -> list:
    # dir() and help() list the public names too, not only what was imported so far.
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["load", "__version__", *_LAZY]
