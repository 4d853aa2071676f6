"""mlxgraph.exporter: PyTorch (Hugging Face) decoders to .mlxg graph files.

``export(model_folder_or_builtin_name, out_path, dtype="float32", max_seq_len=None)``
is the entry point (docs/architecture.md#export). Needs torch and transformers (the ``export``
extra); never imports the interpreter.
"""

from mlxgraph.exporter.pipeline import (
    AdapterError,
    ExportError,
    TraceError,
    UnsupportedModelError,
    UnsupportedOpsError,
    export,
)

__all__ = ["export", "ExportError", "UnsupportedModelError", "AdapterError", "TraceError",
           "UnsupportedOpsError"]
