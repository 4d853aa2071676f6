"""mlxgraph.exporter: PyTorch (Hugging Face) decoders to .mlxg graph files.

``export(model_folder_or_builtin_name, out_path, dtype=None, max_seq_len=None)``
is the entry point (docs/architecture.md#export). Needs torch and transformers (the ``export``
extra); never imports the interpreter. The errors import without torch, and so does
exporter/hub.py (a Hub repo id to its cached folder): the package resolves ``export`` and
the lowering's errors on first use (PEP 562), so a tool that only resolves a model name
(tools/model_graphs.py) never imports torch.
"""

from mlxgraph.exporter.errors import ExportError, TraceError, UnsupportedModelError

_LAZY = {
    "export": "mlxgraph.exporter.pipeline",
    "AdapterError": "mlxgraph.exporter.model_support",
    "UnsupportedOpsError": "mlxgraph.exporter.diagnostics",
}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mlxgraph.exporter' has no attribute {name!r}")


__all__ = ["export", "ExportError", "UnsupportedModelError", "AdapterError", "TraceError",
           "UnsupportedOpsError"]
